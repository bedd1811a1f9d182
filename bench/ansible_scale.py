"""The Ansible anchor of `bench/run.py scale`: bench/ansible/triton.yml (the same steps as
deploys/triton.py, written for Ansible) run as a no-op against the fake fleet of
bench/fakefleet.py, answered from what the converged testbed host answered the same playbook
(bench/fakefleet-ansible.json, `python bench/fakefleet.py record --ansible`).

Ansible's default strategy (`linear`), pipelining and ControlPersist as bench/run.py's 1-host
comparison runs it (bench/ansible_vars.py's ansible.cfg); the inventory is written from the fake
fleet's hosts file (addresses, port, the fake fleet's client key) and the recorded host's
variables. Each run goes through ``python bench/ansible_scale.py run``, which makes itself the
reaper of everything Ansible starts (PR_SET_CHILD_SUBREAPER): the ControlPersist masters OpenSSH
puts in the background are reaped by it when the run ends, so their CPU counts in the run's.

    python bench/ansible_scale.py run ANSIBLE_CFG HOSTS FORKS   # exit 0 only for a clean no-op
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
WORK = BENCH / ".work"
ANSIBLE = BENCH / ".venv-ansible" / "bin" / "ansible-playbook"
PLAYBOOK = BENCH / "ansible" / "triton.yml"
ROOT_MARK = "@@ROOT@@"
# per recorded host: where it is, how to log in (the fake fleet's), never the recorded values
CONNECTION_VARS = ("ansible_host", "ansible_port", "ansible_user", "ansible_ssh_private_key_file")
# bigger fleets are skipped (logged): a linear no-op of ~40 tasks costs every host a forked
# worker per task on the control side, minutes a run at a few hundred hosts on 2 CPUs
MAX_HOSTS = 100
TIMEOUT = 1800  # one Ansible run (seconds)
RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


# Ansible's default (5), and pyinfra's parallelism on this machine (20 x CPUs, what the no-op
# rows run with: pyinfra's default, see docs/scale.md)
FORKS = "5,auto"


def recorded_vars(host_vars: dict, source: Path) -> dict:
    """A recorded host's Ansible variables, without its connection, with this checkout's path
    as a marker, and the pre-flight validating ``source`` (the model repository as written):
    the rendered copy the recording read is a scratch directory of that run, not kept, and the
    no-op never uploads it (its upload task is skipped), so validating the source costs the
    control side the same work without a file the recording would have to carry."""
    keep = {k: v for k, v in host_vars.items() if k not in CONNECTION_VARS}
    command = keep["tf_validate_command"].rsplit(" ", 1)[0]  # ".../tritonfleet validate"
    keep["tf_validate_command"] = f"{command} {source.resolve()}"
    keep["tf_model_repository"] = str(source.resolve())
    return json.loads(json.dumps(keep).replace(str(ROOT), ROOT_MARK))


def config(inventory: Path) -> str:
    """ansible.cfg, for the 1-host comparison (bench/ansible_vars.py) and the fake fleet alike."""
    return ("[defaults]\n"
            f"inventory = {inventory}\n"
            "host_key_checking = False\n"
            "forks = 16\n"
            "interpreter_python = /usr/bin/python3\n"
            "[ssh_connection]\n"
            "pipelining = True\n"
            # Ansible's default ssh_args (connection reuse between runs), plus the test hosts' key policy
            "ssh_args = -C -o ControlMaster=auto -o ControlPersist=60s -o UserKnownHostsFile=/dev/null\n")


def write_inventory(out: Path, hosts_file: Path, variables: dict) -> Path:
    """An Ansible inventory (YAML's JSON subset) of the fake hosts in ``hosts_file`` (bench/fakefleet.py
    write_hosts) with the recorded variables, and its ansible.cfg; returns the cfg's path."""
    fleet = json.loads(hosts_file.read_text())
    data = fleet["data"]
    shared = json.loads(json.dumps(variables).replace(ROOT_MARK, str(ROOT)))
    shared.update(ansible_port=fleet["port"], ansible_user=data.get("ssh_user") or "root",
                  ansible_ssh_private_key_file=data["ssh_key"])
    inventory = {"gpu": {"hosts": {name: {"ansible_host": addr} for name, addr in fleet["hosts"]},
                         "vars": shared}}
    out.mkdir(parents=True, exist_ok=True)
    (out / "inventory.json").write_text(json.dumps(inventory, indent=1))
    cfg = out / "ansible.cfg"
    cfg.write_text(config(out / "inventory.json"))
    return cfg


def env(cfg: Path) -> dict:
    """The environment of an Ansible run: its config, its own ControlPath directory (the
    masters of one run are never reused by another one's fake hosts)."""
    cp = WORK / "ansible-cp"
    cp.mkdir(parents=True, exist_ok=True)
    return dict(os.environ, ANSIBLE_CONFIG=str(cfg), ANSIBLE_NOCOLOR="1", ANSIBLE_SSH_CONTROL_PATH_DIR=str(cp),
                ANSIBLE_LOCAL_TEMP=str(WORK / "ansible-tmp"))


def clean_noop(stdout: str, n: int) -> str:
    """'' for a clean no-op of ``n`` hosts (every host in the recap, changed, unreachable and
    failed all 0), else what was not."""
    recap = RECAP.findall(stdout)
    if len(recap) != n:
        return f"{len(recap)} of {n} hosts in the play recap"
    bad = [f"{h} changed={c} unreachable={u} failed={f}" for h, _ok, c, u, f in recap if (c, u, f) != ("0", "0", "0")]
    return f"not a clean no-op on {len(bad)} host(s): {'; '.join(bad[:5])}" if bad else ""


def playbook_command(forks: int) -> list[str]:
    return [str(ANSIBLE), "-f", str(forks), str(PLAYBOOK)]


def _children() -> list[int]:
    pids = []
    for task in os.listdir("/proc/self/task"):
        try:
            pids += [int(p) for p in Path(f"/proc/self/task/{task}/children").read_text().split()]
        except OSError:
            continue
    return pids


def run(cfg: Path, n: int, forks: int) -> int:
    """One run (a process of its own, measured from outside): Ansible, then the ControlPersist
    masters it left (reparented to this process) ended and reaped."""
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(f"prctl(PR_SET_CHILD_SUBREAPER) failed: errno {ctypes.get_errno()}", file=sys.stderr)
        return 2
    res = subprocess.run(playbook_command(forks), cwd=ROOT, env=env(cfg), capture_output=True, text=True,
                         timeout=TIMEOUT)
    sys.stdout.write(res.stdout[-20000:])
    sys.stderr.write(res.stderr[-6000:])
    masters = _children()
    for pid in masters:  # only this process's own descendants: OpenSSH's ControlPersist masters
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.05)
    problem = clean_noop(res.stdout, n)
    if res.returncode != 0 or problem:
        print(f"Ansible no-op FAILED: exit {res.returncode}; {problem or 'see the output above'}", file=sys.stderr)
        return 1
    print(f"Ansible no-op: {n} hosts clean, {len(masters)} ControlPersist masters reaped", file=sys.stderr)
    return 0


def commands(n: int, hosts_file: Path, forks: list[int], max_hosts: int = MAX_HOSTS,
             answers_path: Path | None = None) -> dict[str, list[str]]:
    """The Ansible measurements of a fake fleet of ``n`` hosts (name -> command), its inventory
    written; none, with the reason logged, above ``max_hosts`` or without Ansible or its answers."""
    from fakefleet import ANSIBLE_ANSWERS

    answers_path = answers_path or ANSIBLE_ANSWERS
    if not forks:
        return {}
    why = (f"{n} hosts is above the Ansible limit of {max_hosts} (--ansible-max-hosts): a run would take "
           "longer than the rest of the size together" if n > max_hosts else
           "Ansible missing: run `bash bench/setup`" if not ANSIBLE.exists() else
           f"{answers_path.name} not recorded: `python bench/fakefleet.py record --ansible` (docs/scale.md)"
           if not answers_path.is_file() else "")
    if why:
        print(f"[bench]   Ansible no-op skipped: {why}", file=sys.stderr, flush=True)
        return {}
    variables = json.loads(answers_path.read_text())["meta"]["vars"]
    cfg = write_inventory(WORK / f"ansible-{n}", hosts_file, variables)
    return {f"Ansible no-op (forks {f})": [sys.executable, str(Path(__file__).resolve()), "run", str(cfg), str(n),
                                           str(f)] for f in forks}


def parse_forks(text: str) -> list[int]:
    """--ansible-forks: "5,auto" (auto: 20 x CPUs, pyinfra's parallelism), "" or "none": no Ansible."""
    if text.strip() in ("", "none"):
        return []
    out = []
    for part in text.split(","):
        out.append(20 * (os.cpu_count() or 1) if part.strip() == "auto" else int(part))
    return sorted(set(out))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "run":
        sys.exit(run(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
    print(__doc__)
    sys.exit(2)
