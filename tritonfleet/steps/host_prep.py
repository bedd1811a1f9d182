"""Host preparation: NVIDIA driver, Docker Engine, NVIDIA Container Toolkit.

Each step checks before it changes (facts), so a re-run on a converged host is a no-op.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from io import StringIO

from pyinfra import host, logger
from pyinfra.facts.server import Command, KernelVersion, LinuxDistribution
from pyinfra.operations import files, server, systemd

from ..core.report import fail
from ..core.shell import q
from ..gpu import guard
from ..host import driver_source, nvidia_repos, vendor_repos
from ..host import kernel_module as kmod
from ..host.facts import AptSources, DockerDaemonJson, DpkgState, FileState, UnitState
from ..host.layer import (
    DAEMON_JSON_HELP,
    DOCKER_PIN_FILE,
    DRIVER_PIN_FILE,
    DRIVER_SETTINGS,
    HOOK_COMMAND,
    KERNEL_MODULE_COMMAND,
    NO_DRIVER,
    NONFREE_FILE,
    NOUVEAU_FILE,
    NOUVEAU_TEXT,
    PERSISTENCE_DROPIN,
    PERSISTENCE_DROPIN_TEXT,
    TOOLKIT_PIN_FILE,
    UNATTENDED_FILE,
    UNATTENDED_TEXT,
    docker_distro_packages,
    docker_facts,
    driver_branch,
    driver_facts,
    driver_repo,
    driver_source_problem,
    driver_upstream_version,
    driver_version_command,
    existing_driver,
    kernel_module,
    persistence_command,
    persistence_modes,
    secure_boot_problem,
    smi_command,
    toolkit_facts,
    wanted_source,
)
from ..host.ops import aptlock, converged
from ..host.ops.apt_repo import vendor_source
from ..host.ops.reboot import reboot
from ..pyinfra_ext import memo
from ..pyinfra_ext.check import check, will_change
from ..pyinfra_ext.install import tritonfleet_step
from ..serving.ops import gpu_guard as guard_ops
from ..serving.ops import lb
from ..settings import access

TOOLKIT_PACKAGES = [
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
]


def driver_pinning_package() -> str | None:
    """NVIDIA's pinning package for the branch, where the repository has one."""
    settings = access.current()
    return nvidia_repos.pinning_package(driver_repo(settings), driver_branch(settings))


def driver_packages() -> list[str]:
    """What the driver install names: the metapackage of the branch and kernel module flavour (at
    the pinned version, if any), and the packages only that flavour has (so apt takes them, not the
    other flavour's, where a package accepts either)."""
    settings = access.current()
    distro, branch, flavour = driver_repo(settings), driver_branch(settings), kernel_module(settings)
    upstream = driver_upstream_version(settings)
    own = access.get("nvidia_driver_packages")
    if own:  # the operator's own list (e.g. signed precompiled modules)
        own = [p.format(branch=branch) for p in own]
        version = access.get("nvidia_driver_version")
        return [f"{p}={version}" for p in own] if version else own
    meta, *own_flavour = nvidia_repos.flavour_packages(distro, branch, flavour)
    own_flavour += nvidia_repos.install_with(distro)  # a distro archive's tools, next to its metapackage
    if not upstream:
        return [meta, *own_flavour]
    version = str(access.get("nvidia_driver_version"))
    # metapackages are <upstream>-1 in every CUDA repository (vendorfacts: version_shape)
    meta_version = version if nvidia_repos.version_matches(distro, version, "metapackage") else f"{upstream}-1"
    return [f"{meta}={meta_version}", *own_flavour]


def other_flavour_packages(installed: dict) -> list[str]:
    """Installed packages that only the other kernel module flavour has (any branch): removed in
    the same apt run that installs this flavour's (they conflict: apt cannot have both)."""
    settings = access.current()
    distro, flavour = driver_repo(settings), kernel_module(settings)
    other = "proprietary" if flavour == "open" else "open"
    names: dict[str, None] = {}
    for b in nvidia_repos.branches(distro):
        mine = set(nvidia_repos.driver_packages(distro, b, flavour))  # a metapackage both share stays
        for p in nvidia_repos.flavour_packages(distro, b, other):
            if p in installed and p not in mine:
                names.setdefault(p)
    return list(names)


def all_metapackages(distro: str) -> set[str]:
    return {nvidia_repos.metapackage(distro, b, f) for b in nvidia_repos.branches(distro) for f in kmod.FLAVOURS}


def uses_own_pin() -> bool:
    """Our apt preferences are written where NVIDIA has no pinning package for the branch, and for
    an exact version (NVIDIA's package pins the branch, not a release)."""
    return driver_pinning_package() is None or bool(access.get("nvidia_driver_version"))


def driver_pin_text() -> str:
    """apt preferences that keep every package of the driver on the configured branch (or release).
    NVIDIA's repositories depend with lower bounds only and Debian's ships every branch under one
    set of names: without a pin apt takes the newest branch, silently. The pin names every package
    of the driver's set (tritonfleet/data/nvidia_repos/), of every branch, at priority 1001 (so a
    switch back to an older branch downgrades)."""
    settings = access.current()
    distro, branch = driver_repo(settings), driver_branch(settings)
    upstream = driver_upstream_version(settings)
    pin = f"{upstream}-*" if upstream else f"{branch}.*"
    names = " ".join(nvidia_repos.all_driver_packages(distro))
    return (
        "# Managed by tritonfleet: driver packages stay on the configured branch.\n"
        f"Package: {names}\nPin: version {pin}\nPin-Priority: 1001\n"
    )


def driver_package_set() -> list[str]:
    """Every package name that belongs to the driver in this host's repository (any branch)."""
    return nvidia_repos.all_driver_packages(driver_repo(access.current()))


def _hold_missing(installed: dict) -> list[str]:
    held = set(memo.fact(DpkgState)["held"])
    return [p for p in driver_package_set() if p in installed and p not in held]


def _hold_command(action: str = "hold") -> str:
    """apt-mark hold|unhold on the installed packages of the driver's set, and nothing else (run
    after the install: it decides on the host which of them are installed then)."""
    names = " ".join(f"-e {q(p)}" for p in driver_package_set())
    return (
        "dpkg-query -W -f '${db:Status-Abbrev} ${Package}\\n' | awk '$1==\"ii\" || $1==\"hi\" {print $2}' "
        f"| grep -x -F {names} | xargs -r apt-mark {action}"
    )


def installed_branches(installed: dict) -> set[str]:
    """Branches of the driver packages installed now (from their versions)."""
    found = set()
    for p in driver_package_set():
        for v in installed.get(p, []):
            major = v.split(":", 1)[-1].split(".", 1)[0]
            if major.isdigit():
                found.add(major)
    return found


def _reboot_needed() -> bool:
    """At execution time: the loaded driver does not match the installed one, or the driver is
    installed but not loaded (nouveau held the GPU, or no module yet): read again when an
    operation before changed the host."""
    if not access.get("nvidia_reboot_if_needed"):
        return False
    raw = memo.fact(Command, command=driver_version_command(access.current())) or ""
    text = raw.lower()
    if "version mismatch" in text:
        logger.warning(f"{host.name}: loaded NVIDIA module does not match the installed driver; rebooting")
        return True
    if NO_DRIVER in text:
        said = next((line.strip() for line in raw.splitlines() if NO_DRIVER in line.lower()), NO_DRIVER)
        logger.warning(
            f"{host.name}: the NVIDIA driver is installed but not loaded (nouveau bound to the "
            f"GPU, or no module yet; `{smi_command(access.current())}` said: {said[:160]}); rebooting once"
        )
        return True
    state = kmod.parse((memo.fact(Command, command=KERNEL_MODULE_COMMAND) or "").splitlines())
    if state.loaded and state.installed and state.loaded != state.installed:
        logger.warning(
            f"{host.name}: the loaded NVIDIA module is {state.loaded}, the installed one {state.installed}; rebooting"
        )
        return True
    return False


def debian_nonfree_text() -> str | None:
    """deb822 source adding the components NVIDIA's driver needs from the distro's own archive
    (Debian: contrib non-free non-free-firmware), for each archive source that lacks them; None
    when nothing is missing (or the distro needs none)."""
    needed = nvidia_repos.apt_components(driver_repo(access.current()))["needed"]
    if not needed:
        return None
    codename = (memo.fact(LinuxDistribution).get("release_meta") or {}).get("VERSION_CODENAME") or ""
    archive = [
        s
        for s in memo.fact(AptSources)
        if s["suites"] and s["suites"][0].split("-")[0] == codename and "main" in s["components"]
    ]
    stanzas = []
    for s in archive:
        missing = [c for c in needed if c not in s["components"]]
        if missing and s["file"] != NONFREE_FILE:
            lines = [
                "Types: deb",
                f"URIs: {' '.join(s['uris'])}",
                f"Suites: {' '.join(s['suites'])}",
                f"Components: {' '.join(missing)}",
            ]
            if s.get("signed_by"):
                lines.append(f"Signed-By: {s['signed_by']}")
            stanzas.append("\n".join(lines))
    if not stanzas:
        return None
    return (
        "# Managed by tritonfleet: components NVIDIA's driver needs (contrib, non-free, firmware)\n"
        + "\n\n".join(stanzas)
        + "\n"
    )


@tritonfleet_step("NVIDIA driver")
def nvidia_driver():
    """The NVIDIA driver, one sub-step a line: refuse a host it cannot change safely,
    finish an interrupted dpkg run, remove another source's driver (migration), the repository, kernel
    headers and nouveau, the driver packages (pinned, switched, held), persistence, and the reboot
    when the loaded driver differs.

    Changes: NVIDIA's CUDA apt source and key (or Debian's non-free), kernel headers, the nouveau
    blacklist, the driver packages and their pin and hold, the persistence daemon's drop-in; reboots
    the host (drained first behind a load balancer) only when the loaded driver is not the installed one.

    Tunables: ``nvidia_driver_source``, ``nvidia_driver_migrate``, ``nvidia_driver_branch``,
    ``nvidia_driver_version``, ``nvidia_driver_packages``, ``nvidia_kernel_module``,
    ``nvidia_kernel_packages``, ``nvidia_hold_packages``, ``nvidia_persistenced``,
    ``nvidia_reboot_if_needed``, ``nvidia_reboot_timeout``, ``cuda_repo_url``, ``apt_lock_timeout``.

    **Example:**

    .. code:: python

        from tritonfleet.steps.host_prep import nvidia_driver

        nvidia_driver()
    """
    memo.prefetch(*driver_facts(access.current()))
    if _refused():
        return
    aptlock.repair_interrupted(name="finish an interrupted dpkg run (dpkg --configure -a)")
    others, removed = _remove_other_source()
    _driver_repository()
    _kernel_headers_and_nouveau()
    flavour, driver_changes = _driver_packages(others, removed)
    persistence_changed = _persistence_dropin()
    _reboot_if_needed(driver_changes, flavour)
    _persistence(persistence_changed)


def _refused() -> bool:
    """Pre-flight refuses these before any host is touched; this guards direct use of the step:
    the host fails with a check, nothing changed. True when refused."""
    for read, what, expected in (
        (
            secure_boot_problem,
            "Secure Boot is enabled or unknown: stop before installing an unloadable driver",
            "Secure Boot off, or nvidia_secure_boot_ok for a host whose module will load",
        ),
        (
            driver_source_problem,
            "the host's driver comes from another source: stop before mixing two",
            "no driver, or one from nvidia_driver_source (or nvidia_driver_migrate = True)",
        ),
    ):
        problem = read(access.current())  # in order: the second is read only when the first found nothing
        if problem:
            check(name=f"check: {what}", function=_fail, message=problem, expected=expected)
            return True
    return False


def _remove_other_source() -> tuple[list[str], set[str]]:
    """nvidia_driver_migrate: the other source goes first, cleanly (holds lifted, purged, the .run
    uninstaller run); ours is installed as on a bare host, and the host reboots once. Returns the
    other sources and the packages they had."""
    found, source = existing_driver(), wanted_source(access.current())
    others = driver_source.conflict(found, source)
    if others:
        server.shell(
            name=f"remove the driver from {', '.join(driver_source.NAMES[s] for s in others)} (nvidia_driver_migrate)",
            commands=aptlock.wrapped(driver_source.removal_commands(found, source), setting="nvidia_driver_migrate"),
        )
    return others, {p for s in others for p in found.packages.get(s, [])}


def _driver_repository() -> None:
    """Where the driver comes from: NVIDIA's CUDA repository (with the distro components its
    packages need), or Debian's own archive."""
    settings = access.current()
    source, distro = wanted_source(settings), driver_repo(settings)
    components = nvidia_repos.apt_components(distro)
    nonfree = debian_nonfree_text()
    if source == "debian":
        # Debian's own archive, signed with Debian's keyring (the archive source's own Signed-By);
        # NVIDIA's repository (left by a migration from it) would offer other builds of the same names
        changed = []
        if memo.fact(FileState, path=vendor_repos.source_path("cuda")) is not None:
            changed.append(
                server.shell(
                    name='remove NVIDIA\'s CUDA repository (nvidia_driver_source = "debian")',
                    commands=[f"rm -f {q(vendor_repos.source_path('cuda'))}"],
                )
            )
        if nonfree:
            changed.append(
                converged.put(
                    name=f"apt source {' '.join(components['needed'])} (Debian's nvidia-driver)",
                    src=StringIO(nonfree),
                    dest=NONFREE_FILE,
                    mode="644",
                )
            )
        if will_change(*changed):
            aptlock.update(name="apt update (Debian's contrib non-free non-free-firmware)")
    else:
        vendor_source(
            vendor_repos.cuda(access.current()),
            also=[
                (f"apt source {' '.join(components['needed'])} (NVIDIA's driver needs them)", NONFREE_FILE, nonfree),
            ]
            if nonfree
            else [],
        )


def _kernel_headers_and_nouveau() -> None:
    """Headers and DKMS for the running kernel (the module is built against them); nouveau
    blacklisted, the initramfs rebuilt when that changed."""
    components = nvidia_repos.apt_components(driver_repo(access.current()))
    kernel = memo.fact(KernelVersion)
    kernel_pkgs = [p.format(kernel=kernel) for p in access.get("nvidia_kernel_packages")]
    kernel_pkgs += [p for p in components["packages"] if p not in kernel_pkgs]
    if kernel_pkgs:
        guard_ops.note(
            "kernel headers and DKMS installed",
            converged.packages(
                name=f"kernel headers and DKMS for {kernel}", packages=kernel_pkgs, setting="nvidia_kernel_packages"
            ),
        )

    nouveau = converged.put(name="blacklist nouveau", src=StringIO(NOUVEAU_TEXT), dest=NOUVEAU_FILE, mode="644")
    if will_change(nouveau):
        server.shell(
            name="rebuild initramfs (nouveau blacklist changed)",
            commands=[
                "if command -v update-initramfs >/dev/null; then update-initramfs -u; "
                "else echo 'no initramfs-tools: nothing to rebuild'; fi"
            ],
        )


def _driver_packages(others: list[str], removed: set[str]) -> tuple[str, bool]:
    """The driver packages of the wanted branch and kernel module flavour: pinned (NVIDIA's
    pinning package, or our own pin), moved from another branch, flavour or release, installed,
    held. Returns (the flavour, whether the driver changes in this run)."""
    settings = access.current()
    distro, branch = driver_repo(settings), driver_branch(settings)
    installed = {p: v for p, v in memo.fact(DpkgState)["installed"].items() if p not in removed}
    pinning = driver_pinning_package()
    other_pins = [p for p in nvidia_repos.pinning_packages(distro) if p in installed and p != pinning]
    if uses_own_pin():
        converged.put(
            name=f"pin driver packages to branch {branch}",
            src=StringIO(driver_pin_text()),
            dest=DRIVER_PIN_FILE,
            mode="644",
        )
    elif memo.fact(FileState, path=DRIVER_PIN_FILE) is not None:
        files.file(
            name=f"remove own driver pin (NVIDIA's {pinning} pins branch {branch})", path=DRIVER_PIN_FILE, present=False
        )
    pkgs = driver_packages()
    # Changing branch: the old branch's held packages would block apt ("held broken packages"),
    # and another branch's pinning package would pin the old branch.
    other = sorted(installed_branches(installed) - {branch})
    flavour = kernel_module(access.current())
    # the other kernel module flavour's packages (switching open <-> proprietary)
    other_kmod = [] if access.get("nvidia_driver_packages") else other_flavour_packages(installed)
    # the pinned release (nvidia_driver_version) differs from what is installed: moved the same way
    upstream = driver_upstream_version(access.current())
    moving = (
        bool(upstream)
        and not other
        and any(
            not v.split(":", 1)[-1].startswith(f"{upstream}-")
            for p in nvidia_repos.driver_packages(distro, branch, flavour)[1:]
            for v in installed.get(p, [])
        )
    )
    switching = bool(other or other_pins or moving or other_kmod)
    if switching:
        # Held packages are never moved as dependencies: release them for this switch only
        # (they are held again below, at the new branch).
        what = (
            f"switch from branch {', '.join(other)}"
            if other
            else f"switch to the {flavour} kernel modules"
            if other_kmod
            else f"move to {upstream or branch}"
        )
        server.shell(name=f"release driver holds to {what}", commands=aptlock.wrapped([_hold_command("unhold")]))
        metas = all_metapackages(distro)
        old_meta = [p for p in installed if p in metas and p != pkgs[0].split("=")[0]]
        if old_meta or other_pins:
            whose = "branch's" if other or other_pins or moving else "kernel module flavour's"
            converged.packages(
                name=f"remove the other {whose} {', '.join(old_meta + other_pins)}",
                packages=old_meta + other_pins,
                present=False,
            )
    if pinning:
        # installed alone, before the driver: apt reads its preferences from the next command on
        converged.packages(
            name=f"NVIDIA's pinning package {pinning}", packages=[pinning], setting="nvidia_driver_branch"
        )
    if switching or others:
        # Lower bounds only: the metapackage is satisfied by the driver already there, and apt
        # leaves installed packages alone: name the installed packages of the set, so apt moves
        # each to its pinned candidate (apt itself, not a check that skips installed packages).
        # The other flavour's packages go in the same apt run ("<package>-": remove), so the host is
        # never without a driver and apt does not stop at their conflicts.
        wanted = set(nvidia_repos.driver_packages(distro, branch, flavour)[1:])
        move = [p for p in driver_package_set() if p in installed and p in wanted and p not in pkgs]
        remove = [f"{p}-" for p in other_kmod]
        also = f", removing {', '.join(p[:-1] for p in remove)}" if remove else ""
        driver = server.shell(
            name=f"NVIDIA driver {', '.join(pkgs)} (and the {len(move)} installed packages of its set{also})",
            commands=aptlock.wrapped(
                [
                    "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --allow-downgrades "
                    + " ".join(pkgs + move + remove)
                ],
                setting=DRIVER_SETTINGS,
            ),
        )
    else:
        driver = converged.packages(name=f"NVIDIA driver {', '.join(pkgs)}", packages=pkgs, setting=DRIVER_SETTINGS)
    driver_changes = bool(switching or others) or will_change(driver)
    guard_ops.note("driver packages installed", driver)
    if access.get("nvidia_hold_packages"):
        if _hold_missing(installed) or driver_changes:
            server.shell(name="hold driver packages (apt-mark hold)", commands=aptlock.wrapped([_hold_command()]))
        converged.put(
            name="keep driver packages out of unattended-upgrades",
            src=StringIO(UNATTENDED_TEXT),
            dest=UNATTENDED_FILE,
            mode="644",
        )
    return flavour, driver_changes


def _persistence_dropin() -> bool:
    """The packaged nvidia-persistenced unit runs --no-persistence-mode: a drop-in turns
    persistence mode on. True when the drop-in changes in this run."""
    persistence_changed = False
    if access.get("nvidia_persistenced"):
        dropin = converged.put(
            name="nvidia-persistenced with --persistence-mode (drop-in)",
            src=StringIO(PERSISTENCE_DROPIN_TEXT),
            dest=PERSISTENCE_DROPIN,
            mode="644",
        )
        persistence_changed = will_change(dropin)
        if persistence_changed:
            guard_ops.note(
                "persistenced drop-in",
                server.shell(
                    name="systemd daemon-reload (persistenced drop-in changed)", commands=["systemctl daemon-reload"]
                ),
            )
    return persistence_changed


def _reboot_if_needed(driver_changes: bool, flavour: str) -> None:
    """A reboot can only be needed when the driver changes now, or the loaded module already
    differs from the installed driver; whether it is, is decided on the host after the install
    (also: installed but not loaded, e.g. nouveau bound to the GPU). Once: a later run reboots
    again only for a version mismatch. Before the daemon starts: it cannot reach the driver
    until then."""
    loaded = memo.fact(Command, command=driver_version_command(access.current())) or ""
    module = kmod.parse((memo.fact(Command, command=KERNEL_MODULE_COMMAND) or "").splitlines())
    if driver_changes or "version mismatch" in loaded.lower() or (module.loaded and module.loaded != flavour):
        reboot(
            name="reboot if the loaded driver does not match the installed one (or is not loaded)",
            reboot_timeout=access.get("nvidia_reboot_timeout"),
            # the kernel that will boot must have the NVIDIA module (built now if it can be)
            header_packages=[p for p in access.get("nvidia_kernel_packages") if "{kernel}" in p],
            install_template=aptlock.wrap(
                "DEBIAN_FRONTEND=noninteractive apt-get install -y -q @WORDS@"
            ).get_raw_value(),
            # a reboot restarts Triton: out of the load balancer first
            before_reboot=lb.drain_command("reboot for the NVIDIA driver") if lb.enabled() else None,
            _if=_reboot_needed,
        )


def _persistence(persistence_changed: bool) -> None:
    """nvidia-persistenced running (restarted when its drop-in changed), persistence mode on."""
    if access.get("nvidia_persistenced"):
        if persistence_changed and memo.fact(UnitState, unit="nvidia-persistenced.service")["running"]:
            server.shell(
                name="restart nvidia-persistenced (persistence mode)",
                commands=["systemctl restart nvidia-persistenced.service"],
            )
        converged.service(
            name="nvidia-persistenced running and enabled", service="nvidia-persistenced", running=True, enabled=True
        )
        check(name=f"check: persistence mode is on ({smi_command(access.current())} -q)", function=_check_persistence)


def _check_persistence():
    raw = memo.fact(Command, command=persistence_command(access.current())) or ""
    text = " ".join(raw.split())
    modes = persistence_modes(raw)
    if not modes or any(m.lower() != "enabled" for m in modes):  # every GPU's, not any line's
        raise RuntimeError(
            f"{host.name}: {smi_command(access.current())} -q shows {text or 'no Persistence Mode line'}, expected Persistence Mode "
            f"Enabled: check `systemctl status nvidia-persistenced` and {PERSISTENCE_DROPIN} on the host "
            "(nvidia_persistenced in inventories/group_data/all.py turns this step off)"
        )


@tritonfleet_step("Docker Engine")
def docker_engine():
    """Docker Engine from Docker's repository (pinned key and version) or the distro's ``docker.io``.

    Changes: Docker's apt source and key, the version pin, the packages (moved to the pinned version
    when another is installed), the docker service running and enabled.

    Tunables: ``docker_source``, ``docker_version``, ``docker_repo_url``, ``docker_repo_key_fingerprint``,
    ``apt_lock_timeout``.

    **Example:**

    .. code:: python

        from tritonfleet.steps.host_prep import docker_engine

        docker_engine()
    """
    source = access.get("docker_source")
    memo.prefetch(*docker_facts(access.current()))
    aptlock.repair_interrupted(name="finish an interrupted dpkg run (dpkg --configure -a)")
    if source == "distro":
        # docker.io and what goes with it on this distro (apparmor; Debian 13: docker-cli)
        engine = converged.packages(
            name="Docker Engine (distro docker.io)", packages=docker_distro_packages(access.current()), update=False
        )
    elif source == "docker":
        vendor_source(vendor_repos.docker(access.current()))
        version = access.get("docker_version")
        if version:
            pin = converged.put(
                name=f"pin Docker Engine to {version}",
                src=StringIO(docker_pin_text(version)),
                dest=DOCKER_PIN_FILE,
                mode="644",
            )
        else:
            pin = files.file(name="Docker Engine not pinned", path=DOCKER_PIN_FILE, present=False)
        engine = converged.packages(
            name="Docker Engine (docker-ce)",
            packages=["docker-ce", "docker-ce-cli", "containerd.io", "docker-buildx-plugin", "docker-compose-plugin"],
        )
        # installed at another version (docker_version changed, or upgraded by hand): apt moves it
        # to the pinned one (packages already present are not touched by apt.packages)
        have = memo.fact(DpkgState)["installed"].get("docker-ce")
        if have and (
            will_change(pin) or (version and not any(fnmatchcase(v, docker_version_pattern(version)) for v in have))
        ):
            server.shell(
                name="move Docker Engine to the pinned version",
                commands=aptlock.wrapped(
                    ["DEBIAN_FRONTEND=noninteractive apt-get install -y -q --allow-downgrades docker-ce docker-ce-cli"],
                    setting="docker_version",
                ),
            )
        if version:
            check(
                name=f"check: docker-ce is {version}",
                function=_check_docker_version,
                pattern=docker_version_pattern(version),
            )
    else:
        raise access.ConfigError(
            f"{host.name}: docker_source must be 'docker' or 'distro', not {source!r} "
            "(group data, inventories/group_data/all.py)"
        )
    guard_ops.note("Docker Engine installed", engine)
    converged.service(name="docker running and enabled", service="docker", running=True, enabled=True)
    return engine


def docker_version_pattern(version: str) -> str:
    """apt's version pattern for docker_version: exact, or 5:<upstream>-* for an upstream version."""
    version = str(version)
    return version if (":" in version or "-" in version) else f"5:{version}-*"


def docker_pin_text(version: str) -> str:
    return (
        "# Managed by tritonfleet: Docker Engine stays at docker_version.\n"
        "Package: docker-ce docker-ce-cli docker-ce-rootless-extras\n"
        f"Pin: version {docker_version_pattern(version)}\nPin-Priority: 1001\n"
    )


def _check_docker_version(pattern: str):
    _, out = host.run_shell_command("dpkg-query -W -f '${Version}' docker-ce 2>&1")
    found = "".join(out.stdout_lines).strip()
    if not fnmatchcase(found, pattern):
        fail(
            f"docker-ce at docker_version ({pattern})",
            f"docker-ce is {found or 'not installed'}: no such version in Docker's repository for this distro?",
            fix="`apt-cache madison docker-ce` lists the versions; set docker_version in group data, then run "
            "the deploy again",
        )


@tritonfleet_step("NVIDIA Container Toolkit")
def container_toolkit():
    """The NVIDIA Container Toolkit at a pinned version, with the nvidia runtime
    registered in Docker's daemon.json without losing its other keys.

    Changes: the toolkit's apt source and key, the version pin and packages, /etc/docker/daemon.json
    (the nvidia runtime), a Docker restart when the runtime was registered or the toolkit's hook is
    new, the udev rule for the /dev/char symlinks of the NVIDIA devices.

    Tunables: ``container_toolkit_version``, ``container_toolkit_repo_url``, ``container_toolkit_key_url``,
    ``container_toolkit_key_fingerprint``, ``apt_lock_timeout``.

    **Example:**

    .. code:: python

        from tritonfleet.steps.host_prep import container_toolkit

        container_toolkit()
    """
    memo.prefetch(*toolkit_facts())
    aptlock.repair_interrupted(name="finish an interrupted dpkg run (dpkg --configure -a)")
    vendor_source(vendor_repos.container_toolkit(access.current()))
    version = access.get("container_toolkit_version")
    pin_text = "".join(f"Package: {p}\nPin: version {version}\nPin-Priority: 1001\n\n" for p in TOOLKIT_PACKAGES)
    converged.put(
        name=f"pin Container Toolkit packages to {version}", src=StringIO(pin_text), dest=TOOLKIT_PIN_FILE, mode="644"
    )
    toolkit = converged.packages(
        name=f"Container Toolkit {version}",
        packages=[f"{p}={version}" for p in TOOLKIT_PACKAGES],
        allow_downgrades=True,
        setting="container_toolkit_version",
    )
    guard_ops.note("Container Toolkit installed", toolkit)

    daemon = memo.fact(DockerDaemonJson)
    if daemon is None:
        # (pre-flight refuses this before any host is touched; this guards direct use of the step)
        check(
            name="check: daemon.json is not valid JSON",
            function=_fail,
            message=DAEMON_JSON_HELP.format(host=host.name),
            expected="/etc/docker/daemon.json is JSON",
        )
        return
    # Both decided from what the host shows now: the nvidia runtime is registered once (nvidia-ctk
    # edits daemon.json in place, keeping the operator's keys), and Docker is restarted only then
    # or when the toolkit's hook is new (dockerd finds it on its PATH only at start).
    configured = "nvidia" in (daemon.get("runtimes") or {})
    if not configured:
        server.shell(
            name="register the nvidia runtime with Docker (nvidia-ctk, keeps other daemon.json keys)",
            commands=["nvidia-ctk runtime configure --runtime=docker"],
        )
    hook_missing = not memo.fact(Command, command=HOOK_COMMAND)
    if not configured or hook_missing:
        systemd.service(
            name="restart Docker (runtime registered or toolkit installed)",
            service="docker",
            running=True,
            restarted=True,
        )
    # /dev/char symlinks for the NVIDIA device nodes, now and at every boot (udev): a daemon-reload
    # then no longer costs running containers their GPUs (tritonfleet.gpu.guard)
    rule = converged.put(
        name="udev rule: /dev/char symlinks for NVIDIA devices (nvidia-ctk)",
        src=StringIO(guard.UDEV_RULE),
        dest=guard.UDEV_RULE_PATH,
        mode="644",
    )
    if will_change(rule) or not memo.fact(Command, command=guard.DEVCHAR_COMMAND):
        server.shell(
            name="create the /dev/char symlinks now (nvidia-ctk system create-dev-char-symlinks --create-all)",
            commands=[guard.CREATE_COMMAND],
        )


def _fail(message: str, expected: str = "a host this step can change safely"):
    fail(expected, message)
