"""Facts about the host itself: apt keys and sources, dpkg, files, units, Docker's daemon.json,
Secure Boot, the driver's files. Each reads, never fails hard."""

from __future__ import annotations

import json
import re

from pyinfra.api import FactBase

from ..core.shell import q
from .driver_source import FILES_COMMAND, parse_files
from .signing_keys import PRIMARY_FPR_AWK, trusted_shell


class KeyringFingerprints(FactBase):
    """Primary-key fingerprints of the keys in a keyring file ([] when the file is missing)."""

    default = list

    def command(self, path: str) -> str:
        p = q(path)
        return (
            f"[ -f {p} ] && gpg --batch --no-default-keyring --show-keys --with-colons {p} "
            f"2>/dev/null | {PRIMARY_FPR_AWK} || true"
        )

    def process(self, output):
        return [line.strip().upper() for line in output if line.strip()]


class RemoteKeyFingerprints(FactBase):
    """The key at ``url`` as the host fetches it, judged on the host by the rule the install step
    applies (tritonfleet.host.signing_keys): {"fingerprints": [primary keys], "trusted": bool, "error": text
    or None}. Nothing is installed: the file goes to a temporary directory and is removed."""

    @staticmethod
    def default():
        return {"fingerprints": [], "trusted": False, "error": "no answer"}

    def command(self, url: str, fingerprint: str) -> str:
        u, key = q(url), '"$t/key"'
        return (
            "t=$(mktemp -d); "
            f"if ! command -v curl >/dev/null || ! command -v gpg >/dev/null; then "
            "echo 'error=curl and gpg are needed on the host (apt-get install curl gnupg)'; "
            f'elif curl -fsSL --retry 2 --max-time 60 -o "$t/key" {u} 2>"$t/err"; then '
            f"if {trusted_shell(key, fingerprint)}; then echo trusted=yes; fi; "
            'for f in $found; do echo "fpr=$f"; done; '
            'else echo "error=$(head -c 300 "$t/err" | tr \'\\n\' \' \')"; fi; rm -rf "$t"; true'
        )

    def process(self, output):
        fprs, error, ok = [], None, False
        for line in output:
            key, _, value = line.strip().partition("=")
            if key == "fpr" and value:
                fprs.append(value.upper())
            elif key == "trusted":
                ok = value == "yes"
            elif key == "error":
                error = value.strip() or "fetch failed"
        if not fprs and not error:
            error = "not an OpenPGP key"
        return {"fingerprints": fprs, "trusted": ok and not error, "error": error}


DPKG_QUERY = "dpkg-query -W -f '${db:Status-Abbrev}\\t${Package}\\t${Version}\\n' 2>/dev/null || true"
# dpkg's journal of status changes not yet folded into its status file: files here mean a dpkg
# run was cut (apt then refuses with "dpkg was interrupted, you must manually run 'dpkg
# --configure -a' to correct the problem")
DPKG_UPDATES = "/var/lib/dpkg/updates"
DPKG_JOURNAL = (
    f'for f in {DPKG_UPDATES}/*; do case "${{f##*/}}" in *[!0-9]*) ;; *) '
    'echo "dpkg-journal=${f##*/}";; esac; done 2>/dev/null; true'
)
# package states a cut dpkg run leaves (dpkg-query's status letter): half-installed, unpacked,
# half-configured, triggers awaited, triggers pending
UNSETTLED = "HUFWt"


class DpkgState(FactBase):
    """Installed packages and their versions, which are held, and what a cut dpkg run left, from
    one ``dpkg-query``: ``{"installed": {name: [version]}, "held": [name], "interrupted": [what]}``
    (``interrupted``: packages in a state dpkg leaves only mid-run, and dpkg's pending journal
    files). (``apt-mark showhold`` gives the same holds but loads apt's whole cache: ~0.4 s of CPU
    on the host, every run.)"""

    @staticmethod
    def default():
        return {"installed": {}, "held": [], "interrupted": []}

    def command(self) -> str:
        return f"{DPKG_QUERY}; {DPKG_JOURNAL}"

    def process(self, output):
        installed: dict[str, list[str]] = {}
        held, interrupted = [], []
        for line in output:
            if line.startswith("dpkg-journal="):
                interrupted.append(f"{DPKG_UPDATES}/{line.strip().partition('=')[2]}")
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 3:
                continue
            status, name, version = parts[0].strip(), parts[1].strip(), parts[2].strip()
            # want/status: "ii" installed, "hi" installed and held (dpkg's own hold flag, the one
            # apt-mark hold sets)
            if len(status) >= 2 and status[1] == "i" and status[0] in "ih":
                installed.setdefault(name, []).append(version)
                if status[0] == "h":
                    held.append(name)
            elif len(status) >= 2 and status[1] in UNSETTLED:
                interrupted.append(name)
        return {"installed": installed, "held": sorted(held), "interrupted": interrupted}


STAT_FORMAT = "mode=%a user=%U group=%G"  # stat's answer for a file: FileState's and FileStates' alike
UNIT_SHOW = "systemctl show --property SubState --property UnitFileState"  # UnitState's and UnitStates'


class FileState(FactBase):
    """Mode (octal string), owner, group and sha256 of a regular file; None when it is missing
    (one remote command: what pyinfra's files.put needs three for)."""

    def command(self, path: str) -> str:
        p = q(path)
        return f"[ -f {p} ] && stat -L -c '{STAT_FORMAT}' {p} && sha256sum {p} 2>/dev/null | cut -d' ' -f1 || true"

    def process(self, output):
        out: dict = {}
        for line in output:
            line = line.strip()
            if line.startswith("mode="):
                out.update(kv.split("=", 1) for kv in line.split() if "=" in kv)
            elif len(line) == 64 and all(c in "0123456789abcdef" for c in line):
                out["sha256"] = line
        # an answer missing any of them (cut, or not stat's) is no file: the caller uploads again
        return out if {"mode", "user", "group", "sha256"} <= out.keys() else None


class UnitState(FactBase):
    """Whether a systemd unit runs and is enabled, from one ``systemctl show``, judged like
    pyinfra's SystemdStatus and SystemdEnabled facts."""

    RUNNING = ("running", "waiting", "exited", "listening", "mounted")
    ENABLED = ("enabled", "static")

    @staticmethod
    def default():
        return {"running": False, "enabled": False}

    def command(self, unit: str) -> str:
        return f"{UNIT_SHOW} {q(unit)} 2>/dev/null || true"

    def process(self, output):
        props = dict(line.strip().split("=", 1) for line in output if "=" in line)
        return {"running": props.get("SubState") in self.RUNNING, "enabled": props.get("UnitFileState") in self.ENABLED}


# a path or unit name that one line of stat's, sha256sum's or systemctl's answer names unambiguously
# (no space, quote, backslash or newline): only those are read together; any other on its own
_JOINABLE_PATH = re.compile(r"^/[A-Za-z0-9._/+:@=-]+$")
_JOINABLE_UNIT = re.compile(r"^[A-Za-z0-9:_.@-]+$")
HASHES = "@@tritonfleet-hashes@@"


class _Together:
    """What memo.prefetch asks of a fact that reads many of one fact's kind (its ``together``):
    ``joinable(**kwargs)``, whether that fact's argument ``ARG`` is a name ``NAMES`` matches, and
    ``gather([kwargs])``, this fact's own argument ``ARGS``: all of them, in order."""

    ARG: str
    ARGS: str
    NAMES: re.Pattern

    @classmethod
    def joinable(cls, **kwargs) -> bool:
        return bool(cls.NAMES.match(kwargs[cls.ARG]))

    @classmethod
    def gather(cls, kwargs_list: list[dict]) -> dict:
        return {cls.ARGS: tuple(k[cls.ARG] for k in kwargs_list)}


class FileStates(_Together, FactBase):
    """:class:`FileState` of many files in one command, as memo.prefetch reads them together (a
    batch's ``together``): one ``stat`` and one ``sha256sum`` for all of them instead of a ``stat``,
    a ``sha256sum`` and a ``cut`` a file (on a converged host's no-op, 11 files: the batch's 31
    facts took 150-170 ms on a 2-CPU test host, 115-125 ms with these and :class:`UnitStates`:
    docs/scale.md). Each file's answer is its own FileState's, parsed by FileState: only regular
    files (``[ -f ]``, a shell builtin, as FileState tests) are stat'ed and hashed."""

    ARG, ARGS, NAMES = "path", "paths", _JOINABLE_PATH

    def command(self, paths: tuple[str, ...]) -> str:
        ps = " ".join(q(p) for p in paths)
        return (
            f'set --; for p in {ps}; do [ -f "$p" ] && set -- "$@" "$p"; done; '
            f"if [ $# -gt 0 ]; then stat -L -c '%n|{STAT_FORMAT}' -- \"$@\" 2>/dev/null; "
            f'echo {HASHES}; sha256sum -- "$@" 2>/dev/null; fi; true'
        )

    def process(self, output):
        stats: dict[str, str] = {}
        hashes: dict[str, str] = {}
        seen_hashes = False
        for line in output:
            if line == HASHES:
                seen_hashes = True
            elif seen_hashes:
                digest, sep, path = line.partition("  ")
                if sep:
                    hashes[path] = digest
            else:
                path, sep, rest = line.partition("|")
                if sep:
                    stats[path] = rest
        return {"stats": stats, "hashes": hashes}

    @staticmethod
    def derived(value, paths: tuple[str, ...]) -> list[tuple]:
        one = FileState()
        return [
            (FileState, {"path": p}, one.process([value["stats"].get(p, ""), value["hashes"].get(p, "")]))
            for p in paths
        ]


class UnitStates(_Together, FactBase):
    """:class:`UnitState` of many units in one ``systemctl show`` (a batch's ``together``, as
    :class:`FileStates`): systemctl prints one block of properties a unit, in the order asked,
    separated by an empty line. An answer with another number of blocks is refused (ValueError):
    memo.prefetch then reads each unit on its own."""

    ARG, ARGS, NAMES = "unit", "units", _JOINABLE_UNIT

    def command(self, units: tuple[str, ...]) -> str:
        names = " ".join(q(u) for u in units)
        return f"{UNIT_SHOW} {names} 2>/dev/null || true"

    def process(self, output):
        blocks: list[list[str]] = [[]]
        for line in output:
            if line.strip():
                blocks[-1].append(line)
            elif blocks[-1]:
                blocks.append([])
        return [b for b in blocks if b]

    @staticmethod
    def derived(value, units: tuple[str, ...]) -> list[tuple]:
        if len(value) != len(units):
            raise ValueError(f"systemctl show answered {len(value)} units of {len(units)}")
        one = UnitState()
        return [(UnitState, {"unit": u}, one.process(block)) for u, block in zip(units, value, strict=True)]


FileState.together = FileStates  # type: ignore[attr-defined]
UnitState.together = UnitStates  # type: ignore[attr-defined]


class DockerDaemonJson(FactBase):
    """/etc/docker/daemon.json parsed ({} when missing, None when not JSON)."""

    default = dict

    def command(self, path: str = "/etc/docker/daemon.json") -> str:
        return f"cat {q(path)} 2>/dev/null || true"

    def process(self, output):
        text = "\n".join(output).strip()
        if not text:
            return {}
        try:
            return json.loads(text)
        except ValueError:
            return None


SECURE_BOOT_EFIVAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


class SecureBoot(FactBase):
    """True when UEFI Secure Boot is enforcing, False when it is off, None when it cannot be told.

    ``mokutil --sb-state`` answers first. Without an answer from it (not installed, or failing),
    the firmware is asked directly: no /sys/firmware/efi means the host did not boot with UEFI (no
    Secure Boot); otherwise the SecureBoot variable of the EFI global vendor GUID, whose data byte
    follows 4 bytes of attributes in efivarfs (Linux Documentation/filesystems/efivarfs.rst), is
    1 when enforcing. Neither answering (UEFI host, no mokutil, efivarfs not readable) is None:
    pre-flight reports it and goes on only with nvidia_secure_boot_unknown_ok."""

    def command(self) -> str:
        return (
            "if command -v mokutil >/dev/null 2>&1; then mokutil --sb-state 2>&1; "
            "else echo 'mokutil: not installed'; fi; "
            "if [ ! -d /sys/firmware/efi ]; then echo 'efi=absent'; "
            f"elif [ -r {SECURE_BOOT_EFIVAR} ]; then "
            f"echo \"efivar=$(od -An -tu1 -j4 -N1 {SECURE_BOOT_EFIVAR} | tr -d ' ')\"; fi; true"
        )

    def process(self, output):
        text = " ".join(output).lower()
        if "secureboot enabled" in text:
            return True
        if "secureboot disabled" in text or "not supported" in text or "doesn't support secure boot" in text:
            return False
        for line in output:
            line = line.strip()
            if line == "efi=absent" or line == "efivar=0":
                return False
            if line == "efivar=1":
                return True
        return None


class AptSources(FactBase):
    """apt's sources as written in /etc/apt/sources.list(.d) (one-line and deb822): a list of
    {"file", "uris", "suites", "components", "signed_by"} for each enabled `deb` entry."""

    default = list

    def command(self) -> str:
        return (
            "for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; "
            'do [ -f "$f" ] && echo "##FILE $f" && cat "$f" && echo; done; true'
        )

    def process(self, output):
        out, current, stanza = [], "", {}

        def flush():
            if stanza and "deb" in stanza.get("types", "").split() and stanza.get("enabled", "yes") != "no":
                out.append(
                    {
                        "file": current,
                        "uris": stanza.get("uris", "").split(),
                        "suites": stanza.get("suites", "").split(),
                        "components": stanza.get("components", "").split(),
                        "signed_by": stanza.get("signed-by", "").strip() or None,
                    }
                )
            stanza.clear()

        for raw in list(output) + [""]:
            line = raw.rstrip("\n")
            if line.startswith("##FILE "):
                flush()
                current = line[7:].strip()
                continue
            if current.endswith(".sources"):
                if not line.strip():
                    flush()
                elif not line.lstrip().startswith("#") and ":" in line and not line.startswith((" ", "\t")):
                    k, _, v = line.partition(":")
                    stanza[k.strip().lower()] = v.strip()
                continue
            words = line.split("#", 1)[0].split()
            if not words or words[0] != "deb":
                continue
            opts, rest = {}, words[1:]
            if rest and rest[0].startswith("["):
                text = " ".join(rest)
                inner, _, after = text[1:].partition("]")
                opts = dict(o.split("=", 1) for o in inner.split() if "=" in o)
                rest = after.split()
            if len(rest) >= 2:
                out.append(
                    {
                        "file": current,
                        "uris": [rest[0]],
                        "suites": [rest[1]],
                        "components": rest[2:],
                        "signed_by": opts.get("signed-by"),
                    }
                )
        return out


class DriverFiles(FactBase):
    """NVIDIA's .run installer on the host: its uninstaller and installer (with the package that
    owns each, "" for none) and its backup log's first line (tritonfleet.host.driver_source)."""

    @staticmethod
    def default():
        return {"files": {}, "runlog": None}

    def command(self) -> str:
        return FILES_COMMAND

    def process(self, output):
        return parse_files(output)


class DockerImageId(FactBase):
    """The local image ID of a tag (None when the image or docker is missing)."""

    def command(self, image: str) -> str:
        return f"docker image inspect --format '{{{{.Id}}}}' {q(image)} 2>/dev/null || true"

    def process(self, output):
        for line in output:
            if line.startswith("sha256:"):
                return line.strip()
        return None
