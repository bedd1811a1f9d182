#!/usr/bin/python3
"""Stand-in nvidia-ctk of the testbed's NVIDIA Container Toolkit packages.

``nvidia-ctk runtime configure --runtime=docker`` edits Docker's daemon.json as the real one
does (NVIDIA/nvidia-container-toolkit pkg/config/engine/docker): adds
``"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}``, keeps every other
key, writes the JSON sorted with four-space indent and no trailing newline, and logs the same
lines (logrus text format) on stderr.  ``nvidia-ctk --version`` prints the version.

``nvidia-ctk system create-dev-char-symlinks [--create-all] [--dev-char-path P] [--driver-root R]
[--dry-run]`` makes ``/dev/char/<major>:<minor>`` symlinks to the NVIDIA device nodes as the real
one does (cmd/nvidia-ctk/system/create-dev-char-symlinks: create-dev-char-symlinks.go, all.go):
``--create-all`` lists every possible node (nvidia-modeset 195:254, nvidiactl 195:255, nvidia-uvm
and nvidia-uvm-tools minors 0 and 1 of the uvm major, nvidia<N> 195:<N> per GPU) whether or not it
exists, without it only existing ``/dev/nvidia*`` nodes; logs "Creating link <link> => <target>"
per node and "Could not create symlink: symlink <target> <link>: file exists" for one already
there, exits 0; ``--create-all`` with ``--watch`` is refused. The GPU count is the stand-in
driver's (one GPU when /etc/nvidia-standin/gpu.env exists: "No NVIDIA devices found" otherwise);
the uvm major, which the kernel assigns at load (509 in the log of Azure/aks-gpu#106), is 509.
"""

import datetime
import json
import os
import sys

VERSION = "@TOOLKIT_VERSION@"
COMMIT = "@COMMIT@"
_T0 = datetime.datetime.now(datetime.timezone.utc)


def log(level: str, msg: str) -> None:
    if sys.stderr.isatty():
        short = {"info": "INFO", "warning": "WARN", "error": "ERRO"}[level]
        sys.stderr.write(f"{short}[0000] {msg:<44} \n")
    else:
        ts = _T0.strftime("%Y-%m-%dT%H:%M:%SZ")
        sys.stderr.write(f'time="{ts}" level={level} msg="{msg}"\n')


def go_json(cfg) -> str:
    text = json.dumps(cfg, indent=4, sort_keys=True, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def parse_flags(args):
    flags, rest = {}, []
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("-") and a != "-":
            name = a.lstrip("-")
            if "=" in name:
                name, value = name.split("=", 1)
            elif name in ("dry-run", "set-as-default", "nvidia-set-as-default", "cdi.enabled",
                          "enable-cdi", "cdi.enable"):
                value = "true"
            elif i + 1 < len(args):
                i += 1
                value = args[i]
            else:
                raise SystemExit(f"flag needs an argument: {a}")
            flags[name] = value
        else:
            rest.append(a)
        i += 1
    return flags, rest


def configure(args) -> int:
    flags, _ = parse_flags(args)
    runtime = flags.get("runtime", "docker")
    if runtime not in ("docker", "containerd", "crio"):
        log("error", f"unrecognized runtime '{runtime}'")
        return 1
    if runtime != "docker":
        log("error", f"runtime {runtime} is not available on this host")
        return 1
    path = flags.get("config") or "/etc/docker/daemon.json"
    name = flags.get("nvidia-runtime-name", "nvidia")
    exe = flags.get("nvidia-runtime-path") or flags.get("runtime-path") or "nvidia-container-runtime"
    set_default = flags.get("set-as-default", flags.get("nvidia-set-as-default", "false")) == "true"
    dry_run = flags.get("dry-run", "false") == "true"
    log("warning", "Ignoring runtime-config-override flag for docker")
    if os.path.isdir(path):
        log("error", f"unable to load config for runtime {runtime}: config file is a directory")
        return 1
    if os.path.exists(path):
        log("info", f"Loading config from {path}")
        try:
            with open(path, encoding="utf-8") as f:
                raw = f.read()
            cfg = json.loads(raw) if raw.strip() else {}
        except ValueError as e:
            log("error", f"unable to load config for runtime {runtime}: {e}")
            return 1
        if not isinstance(cfg, dict):
            log("error", f"unable to load config for runtime {runtime}: not a JSON object")
            return 1
    else:
        log("info", "Config file does not exist; using empty config")
        cfg = {}
    runtimes = cfg.get("runtimes") if isinstance(cfg.get("runtimes"), dict) else {}
    runtimes[name] = {"path": exe, "args": []}
    cfg["runtimes"] = runtimes
    if set_default:
        cfg["default-runtime"] = name
    text = go_json(cfg)
    if dry_run:
        sys.stdout.write(text + "\n")
        return 0
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, mode=0o755, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    log("info", f"Wrote updated config to {path}")
    log("info", f"It is recommended that {runtime} daemon be restarted.")
    return 0


NVIDIA_MAJOR = 195  # the "nvidia" character major (nvidia-frontend before R550)
UVM_MAJOR = 509     # dynamic on real hosts; the value of the public log above


def dev_char_symlinks(args) -> int:
    flags, _ = parse_flags([a for a in args if a not in ("--create-all", "--dry-run", "--watch",
                                                            "--load-kernel-modules", "--create-device-nodes")])
    create_all, dry_run, watch = "--create-all" in args, "--dry-run" in args, "--watch" in args
    if create_all and watch:
        log("error", "create-all and watch are mutually exclusive")
        return 1
    root = flags.get("driver-root", "/")
    dev_char = flags.get("dev-char-path", "/dev/char")
    standin_root = os.environ.get("NVIDIA_STANDIN_ROOT", "")
    gpus = 1 if os.path.isfile(standin_root + "/etc/nvidia-standin/gpu.env") else 0
    if create_all:
        if gpus == 0:
            log("info", f"No NVIDIA devices found in {root}")
            return 0
        nodes = [("/dev/nvidia-modeset", NVIDIA_MAJOR, 254), ("/dev/nvidiactl", NVIDIA_MAJOR, 255),
                 ("/dev/nvidia-uvm", UVM_MAJOR, 0), ("/dev/nvidia-uvm-tools", UVM_MAJOR, 1)]
        nodes += [(f"/dev/nvidia{i}", NVIDIA_MAJOR, i) for i in range(gpus)]
        nodes = [(os.path.join(root, n.lstrip("/")), major, minor) for n, major, minor in nodes]
    else:
        nodes = []
        devdir = os.path.join(root, "dev")
        for name in sorted(os.listdir(devdir)) if os.path.isdir(devdir) else []:
            path = os.path.join(devdir, name)
            if name.startswith("nvidia") and os.path.exists(path) and os.stat(path).st_rdev:
                st = os.stat(path)
                nodes.append((path, os.major(st.st_rdev), os.minor(st.st_rdev)))
    if nodes and not dry_run:
        os.makedirs(dev_char, mode=0o755, exist_ok=True)
    for target, major, minor in nodes:
        link = os.path.join(dev_char, f"{major}:{minor}")
        log("info", f"Creating link {link} => {target}")
        if dry_run:
            continue
        try:
            os.symlink(target, link)
        except FileExistsError:
            log("warning", f"Could not create symlink: symlink {target} {link}: file exists")
    return 0


def main(argv) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print("NAME:\n   NVIDIA Container Toolkit CLI - Tools to configure the NVIDIA Container Toolkit\n\n"
              "USAGE:\n   nvidia-ctk [global options] command [command options]\n\n"
              "COMMANDS:\n   runtime  A collection of runtime-related utilities for the NVIDIA Container Toolkit\n"
              "   system   A collection of system-related utilities for the NVIDIA Container Toolkit")
        return 0
    if argv[0] in ("-v", "--version", "version"):
        print(f"NVIDIA Container Toolkit CLI version {VERSION}\ncommit: {COMMIT}")
        return 0
    args = [a for a in argv if a not in ("--debug", "-d", "--quiet")]
    if args[:2] == ["runtime", "configure"]:
        return configure(args[2:])
    if args[:2] == ["system", "create-dev-char-symlinks"]:
        return dev_char_symlinks(args[2:])
    log("error", f"unsupported command: {' '.join(argv)}")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
