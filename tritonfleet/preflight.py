"""Operator API: the checks that run before any host is touched. A deploy file calls one entry
point first, after ``install.install()``: ``run_all`` (deploys/triton.py), ``host_layer``
(deploys/host.py) or ``triton_layer`` (deploys/models.py); a deploy of your own may call single
checks (``check_settings``, ``check_host_key_policy``, ...). This module is part of the public
surface ``tritonfleet init`` writes into operators' repositories (docs/architecture.md, "Operator
API"): its names stay.

pyinfra runs every host's deploy code (and the facts it reads) before the first operation runs
anywhere, so a problem found here stops the whole run with nothing changed on any host. Each
message names the host, the file to fix and the fix:

* on the control machine: the model repository (Triton's config schema and repository rules),
  the GPU class and driver branch against the Triton image, the registry secret;
* read-only on the host (facts): Secure Boot, the GPU an installed driver reports against the
  inventory's class, /etc/docker/daemon.json, and every vendor signing key the deploy would
  trust: a key not installed yet is fetched by the host into a temporary directory and its
  fingerprint compared with the pinned one.
"""

from __future__ import annotations

import json
import os
from datetime import date
from pathlib import Path, PurePosixPath

from pyinfra import host, logger
from pyinfra.context import ctx_state

from .core.errors import TritonfleetError, UsageError
from .core.exits import entry_point
from .gpu import compat
from .gpu.facts import (
    STATUS_NO_GPU,
    STATUS_OK,
    GpuRecord,
    NvidiaGpus,
    host_gpus,
    nvidia_gpus_args,
    placement_gpus,
)
from .gpu.rules import (
    GPU_CLASSES,
    class_compute_capability,
    compute_capability_problem,
    plan_compute_capability_problem,
)
from .host import nvidia_repos, signing_keys, vendor_repos
from .host.facts import DockerDaemonJson, DockerImageId, KeyringFingerprints, RemoteKeyFingerprints
from .host.gpu_probe import GpuProbe, probe_args
from .host.kernel_module import FLAVOURS
from .host.layer import (
    DAEMON_JSON_HELP,
    driver_branch,
    driver_repo,
    driver_source_problem,
    driver_version_problem,
    host_layer_facts,
    secure_boot_problem,
)

# the model origin stores: also fills the table the settings check reads model_origin's URL rules from
from .model_repo import origin as model_origin
from .model_repo.render import RepositoryError, current_host_repository
from .model_repo.verdicts import plan_cc_filenames, validate_repository
from .pyinfra_ext import hostlock, install, memo
from .pyinfra_ext.transfer import is_ssh_host
from .serving import per_gpu
from .serving.image_mirror import client_secret_problem
from .serving.images import login_registry, needs_login, needs_mirror_login, pulls
from .serving.reads import triton_facts
from .settings import access
from .settings import check as settings_check
from .settings.mirrored import unpinned_images

__all__ = [
    "PreflightError",
    "check_daemon_json",
    "check_driver_branch",
    "check_driver_lifecycle",
    "check_driver_source",
    "check_gpu_class_and_driver",
    "check_gpu_found",
    "check_host",
    "check_host_key_policy",
    "check_image_mirror",
    "check_model_origin",
    "check_model_repository",
    "check_per_gpu",
    "check_plan_compute_capability",
    "check_registry_secret",
    "check_secure_boot",
    "check_settings",
    "check_test_image",
    "check_toolkit_version",
    "check_vendor_keys",
    "host_layer",
    "prefetch_host",
    "run_all",
    "triton_layer",
    "where_from",
]

GROUP_DATA = "inventories/group_data"


class PreflightError(TritonfleetError):
    """Raised while pyinfra prepares operations: nothing has run on any host yet. The entry points
    below end the run with it (tritonfleet.core.exits)."""

    def __init__(self, message: str):
        super().__init__(f"tritonfleet pre-flight failed, no host was changed:\n{message}")


_validated: dict[str, list] = {}


# --------------------------------------------------------------------------- control machine


def check_settings() -> None:
    """Every setting of this host: type, range, known name, known GPU class, refused naming the
    value and where it was set (tritonfleet.settings.check). First: no other check reads one before."""
    state = ctx_state.get() if ctx_state.isset() else None
    origins = settings_check.ValueSources(
        host.inventory, None, settings_check.group_dirs(cwd=getattr(state, "cwd", None))
    )
    try:
        settings_check.check_hosts([host], origins, GPU_CLASSES)
    except settings_check.SettingsError as e:
        raise PreflightError(str(e)) from None


def check_host_key_policy() -> None:
    """pyinfra connects before any tritonfleet code runs and takes the host-key policy from the
    host's data alone: without ssh_strict_host_key_checking there, it used its own accept-new
    (an unknown key trusted on first contact) instead of tritonfleet's default."""
    if is_ssh_host(host) and host.data.get("ssh_strict_host_key_checking") is None:
        raise PreflightError(
            f"{host.name}: ssh_strict_host_key_checking is not set for this host, so pyinfra connected "
            "with its own policy, accept-new (an unknown host key is trusted on first contact). Set "
            f'it in {GROUP_DATA}/all.py (`ssh_strict_host_key_checking = "yes"`, tritonfleet\'s '
            "default; `tritonfleet init` writes that file), check the host's key in known_hosts "
            f"(ssh-keygen -F {host.data.get('ssh_hostname') or host.name}), then run again"
        )


def check_model_repository() -> None:
    # Triton's config schema (protobuf): loaded only by the deploys that have models, and only
    # when the repository changed since it was last found valid (tritonfleet.model_repo.verdicts)

    src = Path(access.get("model_repository"))
    if not src.is_dir():
        raise PreflightError(
            f"{host.name}: model_repository {src} is not a directory "
            f"(set model_repository in {GROUP_DATA}/, relative to where pyinfra runs)"
        )
    base = str(access.get("triton_base_dir"))
    if not base.startswith("/") or ".." in PurePosixPath(base).parts:
        raise PreflightError(
            f"{host.name}: triton_base_dir {base!r} must be an absolute path without '..' "
            f"(set it in {GROUP_DATA}/all.py or the inventory)"
        )

    def validated(repo: Path, gpus: int | None = None) -> None:
        key = f"{repo.resolve()}|{gpus}"
        if key not in _validated:
            _validated[key] = validate_repository(repo, gpus=gpus)
        if _validated[key]:
            lines = "\n".join(f"  {p}" for p in _validated[key])
            raise PreflightError(
                f"{host.name}: model repository {src} is invalid "
                f"(fix it, then check with `tritonfleet validate {src}`):\n{lines}"
            )

    validated(src)  # first as it is: nothing is read through a link out of it
    try:
        local, man, _ = current_host_repository(access.current())
    except RepositoryError as e:  # something a release cannot reproduce on the host
        raise PreflightError(f"{host.name}: {e}") from e
    except ValueError as e:
        where = "" if "gpu_count" in str(e) or "gpu_placement" in str(e) else f" (model_overrides in {GROUP_DATA}/)"
        raise PreflightError(f"{host.name}: {e}{where}") from e
    if local.resolve() != src.resolve():
        # then as this host serves it (model_overrides applied, instances placed on its GPUs)
        gpus = placement_gpus(access.current())
        validated(local, gpus if gpus > 1 else None)
    check_plan_compute_capability(local, man)


def check_plan_compute_capability(repo: Path, man: dict | None = None) -> None:
    """Every TensorRT model of the repository as this host serves it that declares its engines
    per compute capability (cc_model_filenames) has one for the host's GPU class
    (tritonfleet.gpu.rules.plan_compute_capability_problem). Read on the control machine only;
    ``man``: the repository's manifest, where the caller has it."""
    key = str(repo.resolve())
    if key not in _plans:
        _plans[key] = plan_cc_filenames(repo, man)
    gpu_class = host.data.get("gpu_class")
    cc = class_compute_capability(gpu_class)
    if cc is None:  # deploys/models.py alone does not check the class (the full deploy has refused it)
        declaring = sorted(m for m, declared in _plans[key].items() if declared)
        if declaring:
            raise PreflightError(
                f"{host.name}: TensorRT model {declaring[0]!r} declares engines per compute capability "
                f"(cc_model_filenames), but the host's gpu_class {gpu_class!r} is not one of "
                f"{', '.join(GPU_CLASSES)}, so which engine it needs is not known: put the host in a "
                "GPU-class group of the inventory, or set its gpu_class"
            )
        return
    cls = str(gpu_class).upper()
    for model, declared in _plans[key].items():
        problem = plan_compute_capability_problem(model, declared, cls)
        if problem:
            example = json.dumps({model: {"cc_model_filenames": {cc: f"model_{cls.lower()}.plan"}}})
            raise PreflightError(
                f"{host.name}: {problem} ({access.get('model_repository')}/{model}/config.pbtxt). Build the "
                f'engine on a GPU of class {cls} and add `cc_model_filenames {{ key: "{cc}" value: '
                f'"<its file>" }}` with the file in each version directory, or give class {cls} its own '
                f"model through model_overrides in {GROUP_DATA}/{cls.lower()}.py (e.g. model_overrides = "
                f"{example})"
            )


_plans: dict[str, dict[str, dict[str, str]]] = {}


def check_gpu_class_and_driver() -> None:
    gpu_class = host.data.get("gpu_class")
    groups = ", ".join(k.lower() for k in GPU_CLASSES)
    if not gpu_class:
        raise PreflightError(
            f"{host.name}: no gpu_class; put the host in a GPU-class group ({groups}) "
            "of the inventory (e.g. inventories/prod.py: t4 = [...]), or set gpu_class "
            "in its host data"
        )
    if str(gpu_class).upper() not in GPU_CLASSES:
        raise PreflightError(
            f"{host.name}: unknown gpu_class {gpu_class!r}; known: {', '.join(GPU_CLASSES)} "
            f"(put the host in one of the groups {groups} of the inventory, or add the class "
            "to tritonfleet/gpu/rules.py GPU_CLASSES with a group_data file)"
        )
    problem = compute_capability_problem(gpu_class, access.get("triton_image"))
    if problem:
        raise PreflightError(
            f"{host.name}: {problem}: pick a triton_image of an earlier release for this class "
            f"({GROUP_DATA}/{str(gpu_class).lower()}.py) or move these hosts to other GPUs"
        )
    flavour = access.get("nvidia_kernel_module")
    if flavour is not None and flavour not in FLAVOURS:
        raise PreflightError(
            f"{host.name}: nvidia_kernel_module must be one of {', '.join(FLAVOURS)} or None "
            f"(NVIDIA's default for the branch), not {flavour!r} (set it in "
            f"{GROUP_DATA}/{str(gpu_class).lower()}.py or the inventory)"
        )
    cc = class_compute_capability(gpu_class)
    if flavour == "open" and tuple(int(x) for x in cc.split(".")) < (7, 5):
        raise PreflightError(
            f'{host.name}: nvidia_kernel_module = "open", but GPU class {gpu_class} (compute '
            f"capability {cc}) is older than Turing: NVIDIA's open kernel modules do not support it; "
            f'set nvidia_kernel_module = "proprietary" in {GROUP_DATA}/{str(gpu_class).lower()}.py'
        )
    branch = access.get("nvidia_driver_branch")
    if not branch or access.get("nvidia_driver_source") == "debian":
        return  # the distro's default, or its own archive's branches: judged with the host's distro (check_driver_branch)
    version = access.get("nvidia_driver_version") or str(branch)
    image = access.get("triton_image")
    found = compat.verdict(image, version, gpu_class)
    if not found.ok:
        raise PreflightError(
            f"{host.name}: {image} on driver {version} with GPU class {str(gpu_class).upper()}: "
            f"{found.reason}. Fix: {found.fix or 'pick a triton_image and branch from docs/driver-sources.md'} "
            f"(nvidia_driver_branch, triton_image: {GROUP_DATA}/{str(gpu_class).lower()}.py or the "
            "inventory)"
        )


def check_driver_branch() -> None:
    """The branch (set, or the distro's default) exists in NVIDIA's repository for the host's
    distro (or its own archive) and the Triton image can use it; nvidia_driver_version has that
    repository's shape. Refused naming what would work: the branches there that run the image, else
    an older image the branch runs and whether the other nvidia_driver_source is a way on."""
    distro = driver_repo(access.current())
    branch = driver_branch(access.current())
    where = (
        f"nvidia_driver_branch (inventory or {GROUP_DATA}/<class>.py)"
        if access.get("nvidia_driver_branch")
        else f"nvidia_driver_branch_default[{distro!r}] ({GROUP_DATA}/all.py)"
    )
    try:
        available = nvidia_repos.branches(distro)
    except nvidia_repos.UnknownDistro as e:
        raise PreflightError(f"{host.name}: {e}") from e
    image = access.get("triton_image")
    gpu_class = host.data.get("gpu_class")
    if str(gpu_class or "").upper() not in GPU_CLASSES:
        gpu_class = next(iter(GPU_CLASSES))  # no class to judge by (a deploy of its own calling this alone)
    working = [b for b in available if compat.judge(image, b, gpu_class)[0]]
    found = compat.verdict(image, access.get("nvidia_driver_version") or branch, gpu_class)
    if branch not in available:
        head = f"{host.name}: driver branch {branch} is not in {where_from(distro)} (it has {', '.join(available)}); "
        if working:
            raise PreflightError(
                head + f"branches there that {image} supports: {', '.join(working)}. Set "
                f"{where} to one of them (docs/nvidia-repositories.md lists the sources)"
            )
        raise PreflightError(
            head + f"none of them supports {image}. " + no_branch_runs(image, available[-1], gpu_class, distro)
        )
    if not found.ok:
        head = (
            f"{host.name}: driver {branch} ({where_from(distro)}) with GPU class "
            f"{str(gpu_class).upper()}: {found.reason}; "
        )
        if working:
            raise PreflightError(
                head
                + f"branches there that {image} supports: {', '.join(working)}. Set {where}"
                + (f", or use {found.fix.split('; or ', 1)[-1]}" if "triton_image" in found.fix else "")
            )
        raise PreflightError(
            head
            + f"none of its branches ({', '.join(available)}) supports {image}. "
            + no_branch_runs(image, branch, gpu_class, distro)
        )
    problem = driver_version_problem(access.current(), distro, branch)
    if problem:
        raise PreflightError(f"{host.name}: {problem} (nvidia_driver_version: inventory or {GROUP_DATA}/)")


def check_driver_lifecycle(today: date | None = None) -> None:
    """Warn of a driver branch past its end of life (tritonfleet/data/compat/driver_branches.toml):
    NVIDIA no longer fixes it. Names the branches of the host's driver source that run the Triton
    image and are not past theirs. A warning: a host may have to stay on one for a while."""
    today = today or date.today()
    distro = driver_repo(access.current())
    branch = driver_branch(access.current())
    past = compat.end_of_life(access.get("nvidia_driver_version") or branch, today)
    if not past:
        return
    image = access.get("triton_image")
    gpu_class = str(host.data.get("gpu_class") or next(iter(GPU_CLASSES))).upper()
    better = [
        b
        for b in nvidia_repos.branches(distro)
        if compat.judge(image, b, gpu_class)[0] and not compat.end_of_life(b, today)
    ]
    where = (
        f"nvidia_driver_branch (inventory or {GROUP_DATA}/{gpu_class.lower()}.py)"
        if access.get("nvidia_driver_branch")
        else f"nvidia_driver_branch_default[{distro!r}] ({GROUP_DATA}/all.py)"
    )
    logger.warning(
        f"{host.name}: driver branch {branch} ({where_from(distro)}): {past} (tritonfleet/data/compat/"
        "driver_branches.toml): NVIDIA no longer fixes it; "
        + (
            f"branches there that run {image} and are supported: {', '.join(better)} (set {where}; "
            "`tritonfleet rollout ... --data nvidia_driver_branch=N` moves hosts with a canary)"
            if better
            else f"no branch of {where_from(distro)} that runs {image} is supported"
        )
    )


def check_toolkit_version() -> None:
    """Warn when container_toolkit_version is no Container Toolkit release tritonfleet has a row of
    (tritonfleet/data/compat/container_toolkit.toml): what that version changes is unchecked."""
    version = access.get("container_toolkit_version")
    if not version or compat.toolkit_known(version):
        return
    logger.warning(
        f"{host.name}: container_toolkit_version {version!r} is not a Container Toolkit release tritonfleet "
        f"knows (known: {', '.join(compat.toolkit_versions())}; tritonfleet/data/compat/container_toolkit.toml): "
        f"pick one of them as <version>-1 (inventory or {GROUP_DATA}/all.py), or add its row with its sources"
    )


def no_branch_runs(image: str, branch: str, gpu_class, distro: str) -> str:
    """The ways on when no branch of the host's driver source runs ``image``: an older image that
    ``branch`` runs, and the other nvidia_driver_source (or why it is none)."""
    cls = str(gpu_class).upper()
    older = compat.older_image(branch, cls)
    ways = [
        f"Use {older} (triton_image: {GROUP_DATA}/{cls.lower()}.py or the inventory)"
        + (
            f' and nvidia_driver_branch = "{branch}"'
            if access.get("nvidia_driver_branch") not in (None, "", branch)
            else ""
        )
        if older
        else f"No known triton_image runs on R{branch} with GPU class {cls}"
    ]
    if distro in nvidia_repos.archives():  # nvidia_driver_source = "debian": NVIDIA's CUDA repository instead?
        own = vendor_repos.cuda_distro(access.current())
        if own not in nvidia_repos.DISTROS:
            ways.append(
                f'nvidia_driver_source = "cuda" is refused on {own} too: tritonfleet has no facts of '
                f"NVIDIA's CUDA repository for {own} (docs/driver-sources.md)"
            )
        else:
            cuda = [b for b in nvidia_repos.branches(own) if compat.judge(image, b, cls)[0]]
            ways.append(
                f'or set nvidia_driver_source = "cuda" with a branch of NVIDIA\'s {own} repository '
                f"that runs it: {', '.join(cuda)}"
                if cuda
                else f'nvidia_driver_source = "cuda" is no way on: no branch of NVIDIA\'s {own} repository '
                f"runs {image} either"
            )
    return "; ".join(ways)


def where_from(distro: str) -> str:
    """Where the driver's branches come from, in words: "NVIDIA's debian12 repository" (NVIDIA's CUDA
    repository), "Debian 13's own archive" (nvidia_driver_source = "debian")."""
    if distro in nvidia_repos.archives():
        name = distro.removesuffix("-archive")
        family = nvidia_repos.family(distro)
        return f"{family.capitalize()} {name.removeprefix(family)}'s own archive"
    return f"NVIDIA's {distro} repository"


def check_test_image() -> None:
    """Say which CUDA test image the GPU verification will pull (when the host does not have it)."""
    image = access.get("cuda_test_image")
    if not memo.fact(DockerImageId, image=image) and not (access.get("image_archives") or {}).get(image):
        logger.info(
            f"{host.name}: the GPU verification will pull {image} (cuda_test_image, "
            f"{GROUP_DATA}/all.py); NVIDIA deletes end-of-life CUDA tags: if the pull fails, "
            "pick a current tag whose CUDA the driver supports"
        )


def check_registry_secret(images: list[str]) -> None:
    """A pull that needs the registry login has its secret in the environment."""
    env = access.get("registry_password_env")
    for image in pulls(access.current(), [i for i in images if needs_login(access.current(), i)]):
        if not os.environ.get(env):
            raise PreflightError(
                f"{host.name}: {image} is pulled from {login_registry(access.current())} as registry_user "
                f"{access.get('registry_user')!r}, but ${env} is empty on the control machine: export "
                f"the registry secret in ${env} before running pyinfra (it is read only from the "
                f"environment; registry_user and registry_password_env are set in {GROUP_DATA}/)"
            )
    env = access.get("mirror_client_password_env")
    for image in pulls(access.current(), [i for i in images if needs_mirror_login(access.current(), i)]):
        why = client_secret_problem(os.environ.get(env))
        if why:
            raise PreflightError(
                f"{host.name}: {image} is pulled through the image mirror {access.get('image_mirror')}, which asks "
                f"its clients to log in as mirror_client_user {access.get('mirror_client_user')!r} "
                f"(image_mirror_auth), but ${env} on the control machine {why}: export the mirror's client "
                f"password there (the one the mirror's deploy hashed; or set image_mirror_auth = False in "
                f"{GROUP_DATA}/all.py for an open mirror)"
            )


def check_model_origin() -> None:
    """model_origin: its tunables can work, and the origin answers this machine (one request a
    run): a down origin stops the run before any host is touched."""
    try:
        found = model_origin.from_settings(access.current())
    except UsageError as e:
        raise PreflightError(f"{host.name}: {e}") from e
    if found is None:
        return
    try:
        model_origin.check(found)
    except (model_origin.OriginError, UsageError) as e:
        raise PreflightError(
            f"{host.name}: {e}: make the model origin reachable from this machine and the "
            "hosts (or set model_origin = None to push releases over SSH)"
        ) from e


def check_image_mirror() -> None:
    """image_mirror: every image pulled through it is pinned by digest (the mirror then serves
    the same bytes to every host whatever the tag does upstream; tritonfleet.settings.mirrored)."""

    for key, _, upstream in unpinned_images(access.current())[:1]:
        raise PreflightError(
            f"{host.name}: {key} goes through the image mirror {access.get('image_mirror')} but is not pinned by "
            f'digest: set {key} = "{upstream}@sha256:<digest>" in {GROUP_DATA}/all.py (`skopeo inspect '
            f"docker://{upstream}` prints the digest)"
        )


# --------------------------------------------------------------------------- host (read-only)


def prefetch_host(triton: bool = False, first: str | None = None) -> tuple[int, list[str]] | None:
    """One remote command for what pre-flight, the host layer's steps and the placement of model
    instances on the host's GPUs (its GPU record) read; with ``triton``, what the GPU check and the
    Triton steps read too (deploys/triton.py: a converged host is asked once). In the GPU check's
    mode "changes" its host side (GpuProbe) answers the nvidia-smi facts from one query and ``-q``
    report, and both images' IDs from one ``docker image inspect``."""
    smi = nvidia_gpus_args(access.current())["smi"]
    gpu = (
        [(GpuProbe, probe_args(access.get("cuda_test_image"), smi, access.get("triton_image")))]
        if triton and (access.get("gpu_verify_container") or "changes") == "changes"
        else [(NvidiaGpus, nvidia_gpus_args(access.current())), (GpuRecord, {})]
    )
    return memo.prefetch(
        *gpu,
        *host_layer_facts(access.current()),
        (DockerImageId, {"image": access.get("cuda_test_image")}),
        *(triton_facts(access.current()) if triton else []),
        first=first,
    )


def check_host() -> None:
    """What the host already is must fit the inventory; the keys it would trust must be the pinned ones."""
    prefetch_host()
    try:
        check_driver_branch()
        check_driver_lifecycle()
        check_toolkit_version()
        check_driver_source()
        check_secure_boot()
        check_gpu_found()
        check_daemon_json()
        check_vendor_keys()
        check_test_image()
    except access.ConfigError as e:  # e.g. an OS without a CUDA or Docker repository
        raise PreflightError(str(e)) from e


def check_driver_source() -> None:
    """A driver from another source than nvidia_driver_source (CUDA repository, Debian's or
    Ubuntu's packages, the .run installer) is refused with what is there and how to migrate,
    unless nvidia_driver_migrate (tritonfleet.host.driver_source)."""
    problem = driver_source_problem(access.current())
    if problem:
        raise PreflightError(problem)


def check_secure_boot() -> None:
    problem = secure_boot_problem(access.current())
    if problem:
        raise PreflightError(
            problem + " (nvidia_secure_boot_ok, nvidia_secure_boot_unknown_ok: host data "
            f"in the inventory, or {GROUP_DATA}/)"
        )


def check_gpu_found() -> None:
    """A host whose driver already answers must show the GPU model of its inventory class. (On a
    bare host there is no driver to ask yet: the GPU verification after the driver step catches it.)"""
    info = memo.fact(NvidiaGpus, **nvidia_gpus_args(access.current()))
    if info is None or info.status not in (STATUS_OK, STATUS_NO_GPU):
        return
    cls = str(access.get("gpu_class")).upper()
    spec = GPU_CLASSES[cls]
    wrong = [g for g in info.gpus if g.name not in spec["names"]]
    if info.gpus and not wrong:
        return
    found = ", ".join(f"GPU {g.index} {g.name!r}" for g in info.gpus) or "no GPU"
    fits = sorted({c for g in info.gpus for c, s in GPU_CLASSES.items() if g.name in s["names"]})
    fix = (
        f"move the host to the {fits[0].lower()} group of the inventory"
        if len(fits) == 1
        else "put the host in the GPU-class group of the inventory that matches its GPU"
    )
    raise PreflightError(
        f"{host.name}: the inventory puts this host in GPU class {cls} "
        f"({' or '.join(spec['names'])}), but nvidia-smi on the host reports {found}: "
        f"{fix} (or set its gpu_class)"
    )


def check_daemon_json() -> None:
    if memo.fact(DockerDaemonJson) is None:
        raise PreflightError(DAEMON_JSON_HELP.format(host=host.name))


def check_vendor_keys() -> None:
    for repo in vendor_repos.repos(access.current()):
        what, url, tunable = repo.what, repo.key_url, repo.fingerprint_tunable
        pinned = signing_keys.normalize_fingerprint(str(repo.fingerprint))
        if signing_keys.trusted(memo.fact(KeyringFingerprints, path=repo.keyring), pinned):
            continue  # the pinned key is what the host trusts already
        remote = host.get_fact(RemoteKeyFingerprints, url=url, fingerprint=pinned)
        if remote["error"]:
            raise PreflightError(
                f"{host.name}: could not fetch the {what} signing key {url} on the host: "
                f"{remote['error']} (check the host's network or proxy, or the URL "
                f"tunable next to {tunable} in {GROUP_DATA}/all.py)"
            )
        if not remote["trusted"]:
            found = remote["fingerprints"]
            if len(found) > 1:
                raise PreflightError(
                    f"{host.name}: the {what} signing key file at {url} holds {len(found)} primary keys "
                    f"({', '.join(found)}); {tunable} pins {pinned}: {signing_keys.RULE}, so the file is not "
                    "trusted and nothing was installed. Ask the vendor, or serve a file with only the "
                    f"pinned key (and point the URL tunable next to {tunable} in {GROUP_DATA}/all.py at it)"
                )
            raise PreflightError(
                f"{host.name}: the {what} signing key at {url} has fingerprint {', '.join(found)}, but {tunable} "
                f"pins {pinned}: the key is not trusted and nothing was installed. If the vendor rotated "
                f"its key, check the new fingerprint against the vendor's documentation and set "
                f"{tunable} in {GROUP_DATA}/all.py (or your group data)"
            )


def check_per_gpu() -> None:
    """triton_per_gpu: the instances' ports do not collide (tritonfleet.serving.per_gpu)."""

    if not per_gpu.enabled(access.current()):
        return

    if access.get("lb"):
        raise PreflightError(
            f"{host.name}: triton_per_gpu with a load balancer (lb = {access.get('lb')!r}) is not "
            "built: the drain and the backends know one Triton port set per host; set "
            f"triton_per_gpu = False or lb = None for this host ({GROUP_DATA}/all.py, or the "
            "host's inventory data; docs/multi-gpu.md)"
        )
    try:
        per_gpu.check_layout(access.current(), host_gpus(access.current()))
    except ValueError as e:
        raise PreflightError(f"{host.name}: {e} ({GROUP_DATA}/all.py, or the host's inventory data)") from e


# --------------------------------------------------------------------------- per deploy


def _begin(read=None) -> None:
    """What every pre-flight entry point does first, as the steps do (tritonfleet_step): the deploy
    file installed the patches, so the deploy lock is held. ``read``: install.required's."""
    install.required("pre-flight", read)


def _read_host() -> hostlock.Seen | None:
    """run_all's one read of the host, the deploy lock's state first (install.required)."""
    seen = prefetch_host(triton=True, first=hostlock.seen_command())
    return hostlock.parse_seen(seen[1] if seen else None)


@entry_point
def run_all() -> None:
    """deploys/triton.py: everything. The checks before the read read nothing from the host."""
    check_settings()
    check_host_key_policy()
    check_gpu_class_and_driver()
    _begin(read=_read_host)  # the GPU record places model instances (check_model_repository)
    check_model_repository()
    check_model_origin()
    check_image_mirror()
    check_per_gpu()
    check_registry_secret([access.get("cuda_test_image"), access.get("triton_image")])
    check_host()


@entry_point
def host_layer() -> None:
    """deploys/host.py: driver, Docker, toolkit, GPU verification."""
    _begin()
    check_settings()
    check_host_key_policy()
    check_gpu_class_and_driver()
    check_registry_secret([access.get("cuda_test_image")])
    check_host()


@entry_point
def triton_layer() -> None:
    """deploys/models.py: image, models, unit, health gate."""
    _begin()
    check_settings()
    check_host_key_policy()
    check_model_repository()
    check_model_origin()
    check_image_mirror()
    check_per_gpu()
    check_registry_secret([access.get("triton_image")])
