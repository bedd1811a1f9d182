"""Pull mode, the control side: hosts that converge themselves from a release they fetch.

The control machine never connects to a host here. It writes an **origin**: a directory that any
HTTP(S) server serves to the hosts (nginx, a bucket's website, Python's http.server), laid out as

    releases/<sha256>.tar.gz   the operator's repository release: the deploy, the model
                               repository, and every host's inventory data (tritonfleet-release.json);
                               named by its own sha256, which the host checks
    blobs/<sha256>             image archives the inventory names (image_archives), by content
    desired/<host>.json        the release this host should run: {host, release, generation},
                               signed with the operator's key (ssh-keygen -Y sign), so a host
                               follows only what the key signed, for itself, never an older one
    reports/<host>.json        what the host last did (release, generation, result, times), PUT
                               there by the host (the server must accept PUT for reports/)
    dist/                      the pinned agent: tritonfleet's wheel and its dependencies
                               (tritonfleet.fleet.bootstrap)

A pull-mode rollout (``rollout``) is the push rollout's plan (canary, batches, failure budget,
rollback, journal) with each batch published instead of deployed: the batch's pointers name the
new release, and the rollout waits for those hosts' reports; a failed host's pointer goes back to
the release it ran before. Reading a report is a stat and, when it changed, a small JSON file:
the control machine's cost per host is the publishing and that read, not an SSH session.

Signatures are OpenSSH's (``ssh-keygen -Y sign`` / ``-Y verify``, OpenSSH 8.1 and newer: the
ssh-keygen(1) manual page, "-Y sign" and "ALLOWED SIGNERS"): every host already has ssh-keygen
(openssh-client), the key is an ordinary SSH key, and an ssh-agent can hold it.
"""

from __future__ import annotations

import calendar
import contextlib
import fcntl
import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

from ..core.errors import TritonfleetError, UsageError
from ..model_repo.pull_publish import publish_models
from ..settings.defaults import DEFAULTS

FORMAT = 1
MANIFEST = "tritonfleet-release.json"
REPO = "repo"  # the repository's files inside a release archive
NAMESPACE = "tritonfleet-release"  # ssh-keygen -Y namespace: a signature made for nothing else
SIGNER = "tritonfleet-release"  # the identity in the hosts' allowed-signers file
# inventory data that is the control machine's business only: how it connects (a self-converging
# host runs its deploy through pyinfra's @local connector as root)
CONTROL_ONLY_PREFIXES = ("ssh_", "_")
# what a release holds by default besides the deploy: the model repository lives under files/
INCLUDE = ("deploys", "files")
RESULTS = ("ok", "failed", "refused")  # a report's final results ("running" while it runs)


class PullError(TritonfleetError):
    """A pull-mode step that could not be done (origin, signing, a host's report)."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def write_atomic(path: Path, data: bytes) -> None:
    """``data`` at ``path``, never half-written: what a server serves is the old file or the new."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class Origin:
    """The origin directory (``root``) and the URL the hosts reach it at (``url``)."""

    def __init__(self, root: str | os.PathLike, url: str = ""):
        self.root = Path(root)
        self.url = url.rstrip("/")
        if not self.root.is_dir():
            raise UsageError(f"origin {self.root} is not a directory: create it, and serve it to the hosts "
                             "over HTTP(S) (docs/fleet-operations.md, Pull mode)")

    def release(self, sha: str) -> Path:
        return self.root / "releases" / f"{sha}.tar.gz"

    def blob(self, sha: str) -> Path:
        return self.root / "blobs" / sha

    def pointer(self, host: str) -> Path:
        return self.root / "desired" / f"{host}.json"

    def report(self, host: str) -> Path:
        return self.root / "reports" / f"{host}.json"

    @contextlib.contextmanager
    def lock(self, what: str) -> Iterator[None]:
        """One publisher at a time: two rollouts moving the same hosts' pointers would undo each
        other's waves. Refused at once, naming the holder."""
        path = self.root / ".tritonfleet-publish.lock"
        with open(path, "a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                raise PullError(f"origin {self.root} is being published by another run ({f.read().strip() or '?'}): "
                                "let it finish") from None
            f.seek(0)
            f.truncate()
            f.write(f"{what}, pid {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
            f.flush()
            try:
                yield
            finally:
                f.truncate(0)


# --- releases ----------------------------------------------------------------------------------

def host_entry(fh, repo_root: Path, blobs: dict[str, Path]) -> dict:
    """What a host needs of the inventory to run its deploy itself: its groups and its data that
    differs from the package's defaults, without the control machine's connection settings.
    Image archives become blobs of the origin (``blobs``: sha -> local file, filled here)."""
    data = {}
    for key, value in fh.data.items():
        if key.startswith(CONTROL_ONLY_PREFIXES) or (key in DEFAULTS and DEFAULTS[key] == value):
            continue
        data[key] = value
    archives = data.get("image_archives") or {}
    if archives:
        data["image_archives"] = {image: _blob(fh.name, Path(path), repo_root, blobs)
                                  for image, path in archives.items()}
    repo = fh.get("model_repository") or DEFAULTS["model_repository"]
    if Path(repo).is_absolute():
        try:
            data["model_repository"] = str(Path(repo).resolve().relative_to(repo_root.resolve()))
        except ValueError:
            raise UsageError(f"{fh.name}: model_repository {repo} is outside the repository ({repo_root}): a "
                             "self-converging host gets the model repository inside its release; keep it in "
                             "the repository (files/model_repository)") from None
    try:
        json.dumps(data)
    except (TypeError, ValueError) as e:
        raise UsageError(f"{fh.name}: inventory data that is not plain JSON cannot go into a release: {e}") from None
    return {"groups": list(fh.groups), "data": data}


_HASHED: dict[tuple[str, int, int], str] = {}


def _blob(host: str, path: Path, repo_root: Path, blobs: dict[str, Path]) -> dict:
    local = path if path.is_absolute() else repo_root / path
    try:
        st = local.stat()
    except OSError as e:
        raise UsageError(f"{host}: image archive {path} (image_archives) cannot be read: {e}") from None
    key = (str(local), st.st_size, st.st_mtime_ns)
    if key not in _HASHED:
        _HASHED[key] = sha256_file(local)
    blobs[_HASHED[key]] = local
    return {"blob": _HASHED[key], "name": local.name, "size": st.st_size}


def _included(repo_root: Path, include: tuple[str, ...]) -> list[Path]:
    files = []
    for rel in include:
        top = repo_root / rel
        if not top.exists():
            raise UsageError(f"{top} not found: a release holds {', '.join(include)} of the repository "
                             f"({repo_root}); name what exists with --include")
        items = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        files += [p for p in items if "__pycache__" not in p.parts]
    return files


def build_release(hosts: list, deploy: str, repo_root: Path, include: tuple[str, ...] = INCLUDE
                  ) -> tuple[bytes, str, dict[str, Path]]:
    """The release archive of ``repo_root`` for ``hosts`` (deterministic: the same files and data
    make the same bytes, so publishing twice is one release), its sha256, and the blobs it names."""
    deploy_rel = Path(deploy)
    if deploy_rel.is_absolute():
        deploy_rel = deploy_rel.resolve().relative_to(repo_root.resolve())
    if not (repo_root / deploy_rel).is_file():
        raise UsageError(f"deploy {deploy} not found in {repo_root}")
    include = tuple(dict.fromkeys((*include, str(deploy_rel.parent) if str(deploy_rel.parent) != "." else str(deploy_rel))))
    blobs: dict[str, Path] = {}
    entries = {fh.name: host_entry(fh, repo_root, blobs) for fh in hosts}
    for fh in hosts:
        repo = Path(entries[fh.name]["data"].get("model_repository") or DEFAULTS["model_repository"])
        if not any(repo == Path(i) or Path(i) in repo.parents for i in include):
            raise UsageError(f"{fh.name}: model_repository {repo} is not in the release ({', '.join(include)}): "
                             f"add it with --include {repo}")
    manifest = {"format": FORMAT, "deploy": str(deploy_rel), "hosts": entries,
                "blobs": {sha: {"name": p.name, "size": p.stat().st_size} for sha, p in sorted(blobs.items())}}
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=6) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, MANIFEST, json.dumps(manifest, sort_keys=True, indent=1).encode(), 0o644)
        for path in _included(repo_root, include):
            _add(tar, f"{REPO}/{path.relative_to(repo_root).as_posix()}", path.read_bytes(),
                 0o755 if os.access(path, os.X_OK) else 0o644)
    data = raw.getvalue()
    return data, hashlib.sha256(data).hexdigest(), blobs


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = \
        len(data), mode, 0, 0, 0, "root", "root"
    tar.addfile(info, io.BytesIO(data))


def publish_release(origin: Origin, hosts: list, deploy: str, repo_root: Path,
                    include: tuple[str, ...] = INCLUDE) -> str:
    """Build the release and put it (and its blobs) on the origin; its id (sha256)."""
    data, sha, blobs = build_release(hosts, deploy, repo_root, include)
    publish_models(hosts, repo_root)  # a model origin's releases: the hosts only read it
    if not origin.release(sha).is_file():
        write_atomic(origin.release(sha), data)
    for bsha, local in blobs.items():
        dest = origin.blob(bsha)
        if dest.is_file():
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{bsha}.tmp")
        tmp.unlink(missing_ok=True)
        try:
            os.link(local, tmp)  # same file system: no copy of a multi-GB archive
        except OSError:
            with open(local, "rb") as src, open(tmp, "wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    return sha


# --- signed pointers -------------------------------------------------------------------------

def public_key(key: Path) -> str:
    """The public half of the signing key (``key``.pub, else derived with ssh-keygen -y)."""
    pub = Path(f"{key}.pub")
    if pub.is_file():
        return pub.read_text().split("\n")[0].strip()
    res = subprocess.run(["ssh-keygen", "-y", "-f", str(key)], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if res.returncode != 0:
        raise UsageError(f"signing key {key}: {res.stderr.strip() or 'ssh-keygen -y failed'}")
    return res.stdout.strip()


def allowed_signers(key: Path) -> str:
    """The hosts' allowed-signers file for ``key`` (ssh-keygen(1), ALLOWED SIGNERS: principal,
    then the key; ``namespaces=`` limits it to release pointers)."""
    return f'{SIGNER} namespaces="{NAMESPACE}" {public_key(key)}\n'


def sign(key: Path, payloads: dict[str, bytes], batch: int = 500) -> dict[str, str]:
    """The signature of each payload (armored, as ssh-keygen writes it), made by one ssh-keygen
    process per ``batch`` payloads."""
    out: dict[str, str] = {}
    names = list(payloads)
    with tempfile.TemporaryDirectory(prefix="tritonfleet-sign-") as tmp:
        for start in range(0, len(names), batch):
            part = names[start:start + batch]
            files = []
            for i, name in enumerate(part):
                p = Path(tmp) / f"{start + i}"
                p.write_bytes(payloads[name])
                files.append(p)
            res = subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-f", str(key), "-n", NAMESPACE,
                                  *map(str, files)], capture_output=True, text=True, stdin=subprocess.DEVNULL)
            if res.returncode != 0:
                raise PullError(f"signing with {key} failed: {res.stderr.strip()[-400:]} (an unencrypted key, or "
                                "the public key with the private one in ssh-agent)")
            for name, p in zip(part, files, strict=True):
                out[name] = Path(f"{p}.sig").read_text()
    return out


def verify(signers: Path, payload: bytes, signature: str) -> str:
    """"" when ``signature`` is a valid signature of ``payload`` by a key of ``signers``; else why
    not (ssh-keygen's words)."""
    with tempfile.NamedTemporaryFile("w", suffix=".sig") as sig:
        sig.write(signature)
        sig.flush()
        res = subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(signers), "-I", SIGNER, "-n", NAMESPACE,
                              "-s", sig.name], input=payload, capture_output=True)
    return "" if res.returncode == 0 else (res.stderr.decode(errors="replace").strip() or "signature refused")


def read_pointer(path: Path) -> dict | None:
    """A pointer file's payload as the control machine wrote it (not verified: its own file)."""
    try:
        return json.loads(json.loads(path.read_bytes())["payload"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def publish_desired(origin: Origin, key: Path, desired: dict[str, str], rollout_id: str) -> int:
    """Point each host of ``desired`` at its release; the generation these pointers carry (higher
    than any before on this origin, so a host never goes back to an older pointer)."""
    if not desired:
        return 0
    gen_file = origin.root / "desired" / ".generation"
    try:
        last = int(gen_file.read_text().strip())
    except (OSError, ValueError):
        last = 0
    generation = max(last + 1, int(time.time() * 1000))
    published = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    payloads = {host: json.dumps({"format": FORMAT, "host": host, "release": release, "generation": generation,
                                  "rollout": rollout_id, "published": published}, sort_keys=True).encode()
                for host, release in desired.items()}
    sigs = sign(key, payloads)
    write_atomic(gen_file, f"{generation}\n".encode())
    for host, payload in payloads.items():
        write_atomic(origin.pointer(host), json.dumps({"payload": payload.decode(), "signature": sigs[host]}).encode())
    return generation


# --- reports ----------------------------------------------------------------------------------

class Reports:
    """The hosts' reports on the origin, read again only when a file changed (a stat a host)."""

    def __init__(self, origin: Origin):
        self.origin = origin
        self._seen: dict[str, tuple[int, int, dict | None]] = {}

    def read(self, host: str) -> dict | None:
        path = self.origin.report(host)
        try:
            st = path.stat()
        except OSError:
            return None
        seen = self._seen.get(host)
        if seen and seen[:2] == (st.st_mtime_ns, st.st_size):
            return seen[2]
        try:
            rep = json.loads(path.read_bytes())
        except (OSError, ValueError):
            rep = None  # being written, or not ours: read again next time
        if not isinstance(rep, dict) or rep.get("host") != host:
            rep = None
        self._seen[host] = (st.st_mtime_ns, st.st_size, rep)
        return rep


def short(release: str | None) -> str:
    return (release or "-")[:12]


def describe(rep: dict | None) -> str:
    """One line of a host's report for a person."""
    if not rep:
        return "no report"
    when = rep.get("finished") or rep.get("started") or "?"
    text = f"{rep.get('result', '?')} on {short(rep.get('release'))} at {when}"
    return f"{text}: {rep['error']}" if rep.get("error") else text


# --- the pull-mode rollout ----------------------------------------------------------------------

def rollout(inventory: str, deploy: str, origin: Origin, key: Path, *, limit: list[str] | None = None,
            canary: int = 1, batch: str | int = "25%", max_fail: int = 0, data: dict | None = None,
            timeout: float | None = None, include: tuple[str, ...] = INCLUDE,
            echo: Callable[[str], None] = print, poll: float = 1.0):
    """Publish the repository (``deploy`` and what ``include`` names, from the current directory)
    as a release, then move the targets to it batch by batch: canary first, each batch's pointers
    published and its hosts' reports awaited; a host that fails (or does not report within
    ``timeout``) is pointed back at the release it ran before; more than ``max_fail`` failures
    halt the rollout, the hosts not reached yet keep their pointers. Returns the push rollout's
    Report (tritonfleet.fleet.rollout), so both modes print and exit alike."""
    from . import inventory as fleet
    from .rollout.journal import JOURNAL, Journal
    from .rollout.plan import RolloutError, plan_batches
    from .rollout.report import HostResult, Report

    if max_fail < 0:
        raise UsageError("--max-fail must be >= 0")
    if not key.is_file() and not Path(f"{key}.pub").is_file():
        raise UsageError(f"signing key {key} not found (the key whose public half the hosts' bootstrap trusts)")
    t_start = time.monotonic()
    try:
        hosts = fleet.load_inventory(inventory, data=data, limit=limit)
        batches = plan_batches([h.name for h in hosts], canary, batch)
    except (fleet.FleetError, RolloutError) as e:
        raise UsageError(str(e)) from e
    names = [h.name for h in hosts]
    wait = float(timeout if timeout is not None else hosts[0].get("pull_report_timeout", DEFAULTS["pull_report_timeout"]))
    report = Report(inventory, deploy, batches, [HostResult(n) for n in names])
    with origin.lock(f"pull rollout of {deploy}"):
        sha = publish_release(origin, hosts, deploy, Path.cwd(), include)
        rollout_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{sha[:8]}"
        logs = Path(os.environ.get("TRITONFLEET_LOG_DIR", ".tritonfleet/rollouts")) / rollout_id
        logs.mkdir(parents=True, exist_ok=True)
        report.log_dir = str(logs)
        journal = Journal(logs / JOURNAL)
        journal.write("start", mode="pull", inventory=inventory, deploy=deploy, origin=str(origin.root),
                      release=sha, limit=list(limit or []), canary=canary, batch=str(batch), max_fail=max_fail,
                      batches=batches, hosts=names, cwd=os.getcwd(), pid=os.getpid())
        echo(f"pull rollout of release {short(sha)} ({deploy}) to {len(names)} host(s) of {inventory} through "
             f"{origin.root}: {len(batches)} batch(es) {[len(b) for b in batches]}, canary {min(canary, len(names))}, "
             f"max {max_fail} failure(s), {wait:.0f} s a batch for the reports; journal in {logs}")
        reports = Reports(origin)
        run = _PullRun(origin, key, sha, rollout_id, report, journal, reports, echo, wait, poll, max_fail, canary)
        try:
            run.before()
            if run.failures <= max_fail:
                run.batches(batches)
            else:
                report.halted = f"{run.failures} host(s) never reported (not converging themselves; max {max_fail})"
        except KeyboardInterrupt:
            report.halted = (f"interrupted (Ctrl-C) during {run.current or 'the start'}: the pointers published so far "
                             "stay; `tritonfleet status --pull ORIGIN` shows where each host is")
        report.seconds = time.monotonic() - t_start
        for r in report.hosts:
            if r.result == "not touched" and r.after == "-":
                r.after = r.before
        if report.halted:
            echo(f"HALTED: {report.halted}")
        journal.write("end", ok=report.ok, halted=report.halted,
                      results={r.host: asdict(r) for r in report.hosts if r.batch})
    return report


class _PullRun:
    def __init__(self, origin, key, sha, rollout_id, report, journal, reports, echo, wait, poll, max_fail, canary):
        self.origin, self.key, self.sha, self.rollout_id = origin, key, sha, rollout_id
        self.report, self.journal, self.reports, self.echo = report, journal, reports, echo
        self.wait, self.poll, self.max_fail, self.canary = wait, poll, max_fail, canary
        self.results = {r.host: r for r in report.hosts}
        self.was: dict[str, str | None] = {}  # the release each host was pointed at before
        self.unreachable: list[str] = []
        self.failures = 0
        self.current = ""

    def before(self) -> None:
        """Where every target is: its pointer's release and its last report. A host that never
        reported is not converging itself (no bootstrap, or gone): not touched, a failure."""
        for name, r in self.results.items():
            ptr = read_pointer(self.origin.pointer(name))
            rep = self.reports.read(name)
            self.was[name] = (ptr or {}).get("release") or (rep or {}).get("release")
            r.before = short((rep or {}).get("release"))
            if rep is None:
                r.result, r.detail = "unreachable", "no report on the origin: not converging itself (bootstrap it)"
                self.unreachable.append(name)
        self.failures = len(self.unreachable)
        self.journal.write("before", hosts={n: {"pointer": self.was[n], "report": self.reports.read(n)}
                                            for n in self.results})
        if self.unreachable:
            self.echo(f"never reported (not touched): {', '.join(self.unreachable)}")

    def batches(self, batches: list[list[str]]) -> None:
        for i, b in enumerate(batches, 1):
            todo = [n for n in b if n not in self.unreachable]
            if not todo:
                continue
            label = "canary" if i == 1 and self.canary else f"batch {i}/{len(batches)}"
            self.current = label
            t0 = time.monotonic()
            gen = publish_desired(self.origin, self.key, dict.fromkeys(todo, self.sha), self.rollout_id)
            self.journal.write("batch", index=i, hosts=todo, generation=gen)
            self.echo(f"[{label}] release {short(self.sha)} published for {len(todo)} host(s); waiting for their reports")
            outcome = self.await_reports(todo, gen, self.sha)
            failed = {n: why for n, (ok, why, _) in outcome.items() if not ok}
            elapsed = time.monotonic() - t0
            for n in todo:
                r = self.results[n]
                r.batch, r.seconds = i, elapsed
                rep = outcome[n][2]
                r.after = short((rep or {}).get("release"))
                if n in failed:
                    r.result, r.detail = "failed", failed[n]
                    r.failure = (rep or {}).get("failure")
                else:
                    r.result = "updated" if (rep or {}).get("changed", 1) else "unchanged"
            if failed:
                self.echo(f"[{label}] failed: " + "; ".join(f"{n}: {w}" for n, w in failed.items()))
                self.roll_back(list(failed), i)
            self.failures += len(failed)
            self.journal.write("batch-done", index=i, failures=self.failures,
                               results={n: asdict(self.results[n]) for n in todo})
            self.echo(f"[{label}] done in {elapsed:.1f}s: " + ", ".join(f"{n} {self.results[n].result}" for n in todo))
            if self.failures > self.max_fail:
                left = sum(len([n for n in bb if n not in self.unreachable]) for bb in batches[i:])
                self.report.halted = (f"{self.failures} failure(s), more than --max-fail {self.max_fail}: halted after "
                                      f"{label}; {left} host(s) not touched")
                return

    def await_reports(self, hosts: list[str], generation: int, release: str) -> dict[str, tuple[bool, str, dict | None]]:
        """Each host's verdict once its report of ``generation`` (or a later one) is final: (ok,
        why not, the report); a host with no such report within the wait is failed."""
        pending, out = set(hosts), {}
        deadline = time.monotonic() + self.wait
        while pending:
            for n in sorted(pending):
                rep = self.reports.read(n)
                if not rep or int(rep.get("generation") or 0) < generation or rep.get("result") not in RESULTS:
                    continue
                ok = rep["result"] == "ok" and rep.get("release") == release
                out[n] = (ok, "" if ok else describe(rep), rep)
                pending.discard(n)
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(self.poll)
        for n in pending:
            rep = self.reports.read(n)
            out[n] = (False, f"no report of release {short(release)} within {self.wait:.0f} s (last: {describe(rep)})", rep)
        return out

    def roll_back(self, failed: list[str], index: int) -> None:
        back = {n: self.was[n] for n in failed if self.was.get(n) and self.was[n] != self.sha}
        for n in failed:
            if n not in back:
                self.results[n].detail += " (no earlier release on the origin: nothing to roll back to)"
        if not back:
            return
        self.echo(f"rolling back {', '.join(back)} to the release each ran before")
        gen = publish_desired(self.origin, self.key, back, self.rollout_id)
        self.journal.write("rollback", index=index, hosts=back, generation=gen)
        by_release: dict[str, list[str]] = {}
        for n, rel in back.items():
            by_release.setdefault(rel, []).append(n)
        for rel, names in by_release.items():
            for n, (ok, why, rep) in self.await_reports(names, gen, rel).items():
                r = self.results[n]
                r.after = short((rep or {}).get("release"))
                if ok:
                    r.result = "rolled back"
                else:
                    r.result, r.detail = "rollback failed", f"{r.detail}; rollback: {why}"


# --- status -------------------------------------------------------------------------------------

def status(hosts: list, origin: Origin, now: float | None = None) -> list[dict]:
    """Each host as its own report says (no SSH): the release it should run (its pointer), the one
    it ran last, the result, when; ``drift`` says what is not right (no report, a failed run, not on
    its desired release, no run for longer than two converge intervals)."""
    now = time.time() if now is None else now
    reports = Reports(origin)
    rows = []
    for fh in hosts:
        rep = reports.read(fh.name) or {}
        want = (read_pointer(origin.pointer(fh.name)) or {}).get("release")
        drift = []
        finished = rep.get("finished")
        age = now - calendar.timegm(time.strptime(finished, "%Y-%m-%dT%H:%M:%SZ")) if finished else None
        if not rep:
            drift.append("no report (not converging itself: bootstrap it)")
        elif rep.get("result") in ("failed", "refused"):
            drift.append(f"last run {rep['result']}: {rep.get('error') or '?'}")
        if rep and want and rep.get("release") != want and rep.get("result") != "running":
            drift.append(f"runs {short(rep.get('release'))}, should run {short(want)}")
        limit = 2 * float(fh.get("pull_converge_interval", DEFAULTS["pull_converge_interval"])) + \
            float(fh.get("pull_poll_interval", DEFAULTS["pull_poll_interval"]))
        if age is not None and age > limit:
            drift.append(f"no run for {age / 60:.0f} min (its timer stopped, or it cannot reach the origin)")
        rows.append({"host": fh.name, "desired": want, "release": rep.get("release"), "result": rep.get("result"),
                     "finished": finished, "age_seconds": None if age is None else round(age),
                     "generation": rep.get("generation"), "error": rep.get("error") or "", "drift": drift})
    return rows
