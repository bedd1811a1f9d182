"""The systemd unit that runs Triton: its values from a host's tunables and its text from
``templates/triton.service.j2``.

Shared by the Triton service step (which writes the unit), the rollback and the deploy history
(which name a unit by its digest) and the read side (``tritonfleet status`` and ``rollout``
compare the unit on the host with the one the inventory asks for). Pure: renders text, runs
nothing.
"""

from __future__ import annotations

import functools
import hashlib
import marshal
import os
import pickle

import jinja2
from jinja2.bccache import bc_magic

from .. import TEMPLATES
from ..core import local_cache, speed
from ..pyinfra_ext import compat
from ..settings.access import ConfigError, Settings
from . import apikey
from .per_gpu import instance_gets

MODEL_CONTROL_MODES = ("none", "explicit")
# unit template values that are the tunable triton_<name> as it is
UNIT_TUNABLES = (
    "image",
    "gpus",
    "shm_size",
    "ulimit_memlock",
    "ulimit_stack",
    "http_port",
    "grpc_port",
    "metrics_port",
    "http_bind",
    "grpc_bind",
    "metrics_bind",
    "strict_model_config",
    "start_timeout",
)


def unit_context(settings: Settings) -> dict:
    """Values the unit template is rendered with, from a host's ``settings`` (the deploy: the
    current host's; the fleet commands: an inventory host)."""
    base = settings.get("triton_base_dir")
    mode = settings.get("triton_model_control_mode") or "none"
    if mode not in MODEL_CONTROL_MODES:
        raise ConfigError(
            f"triton_model_control_mode must be one of {', '.join(MODEL_CONTROL_MODES)}, "
            f"not {mode!r} (group data; poll mode is not for production)"
        )
    apis = restricted_apis(settings)
    return {
        **{key: settings.get(f"triton_{key}") for key in UNIT_TUNABLES},
        "container": settings.get("triton_container_name"),
        "base_dir": base,
        "model_repository": f"{base}/model_repository",
        "model_control_mode": mode,
        "extra_args": settings.get("triton_extra_args") or [],
        "user": settings.get("triton_container_user", "") or "",
        "restricted_apis": apis,
        "api_key_file": settings.get("triton_api_key_file") if apis else "",
        "key_script": apikey.unit_script(apis) if apis else "",
        **stop_context(settings),
    }


def stop_context(settings: Settings) -> dict:
    """Triton's --exit-timeout-secs, docker stop -t and TimeoutStopSec, from triton_stop_timeout."""
    from .drain import stop_timeouts

    try:
        return stop_timeouts(settings.get("triton_stop_timeout"))
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"triton_stop_timeout must be a whole number of seconds >= 0, not "
            f"{settings.get('triton_stop_timeout')!r} (group data)"
        ) from e


def restricted_apis(settings: Settings) -> list[str]:
    """``triton_restricted_apis``, checked: Triton's categories only, a key file where the
    container cannot see it."""
    apis = list(settings.get("triton_restricted_apis", []) or [])
    unknown = [a for a in apis if a not in apikey.CATEGORIES]
    if unknown:
        raise ConfigError(
            f"triton_restricted_apis: {', '.join(map(repr, unknown))} is not a Triton API "
            f"category (known: {', '.join(apikey.CATEGORIES)}); fix it in group data "
            "(inventories/group_data/all.py)"
        )
    if apis:
        key, base = str(settings.get("triton_api_key_file") or ""), str(settings.get("triton_base_dir")).rstrip("/")
        if not key.startswith("/") or ".." in key or key.startswith(base + "/") or any(c in key for c in " %$'\\\n\""):
            raise ConfigError(
                f"triton_api_key_file {key!r} must be a plain absolute path outside "
                f"triton_base_dir ({base}: the container sees that directory); fix it in "
                "group data (inventories/group_data/all.py)"
            )
    return apis


@functools.cache
def _templates():
    """One jinja2 environment for the process: it compiles the unit template once, not once per
    host (it still reloads a changed file), and, speed-only (``jinja_bytecode``), keeps the
    compiled template for the next run in jinja2's bytecode cache in the control machine's cache
    directory, keyed by the template's source and jinja2's version (docs/scale.md, "Speed-only
    features"). With the speed switch off, plain jinja2 compiles it in every process."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        bytecode_cache=_bytecode_cache() if _bytecode_usable() else None,
    )


def _bytecode_usable() -> bool:
    """The speed switch is on and jinja2 writes its cache entries as :func:`_bytecode_cache` reads
    them (tritonfleet.pyinfra_ext.compat, ``jinja_bytecode``)."""
    return speed.on("jinja_bytecode") and not compat.check({"jinja_bytecode"}).mismatches


def _bytecode_cache():
    """jinja2's FileSystemBytecodeCache in CACHE_DIR/jinja, where a cache it cannot use (a
    directory it cannot write, a file it cannot read back) only costs a compilation."""

    class Cache(jinja2.FileSystemBytecodeCache):
        def load_bytecode(self, bucket) -> None:
            """jinja2's own file (its magic, the pickled checksum of the template's source, the
            marshalled code), read without unpickling it: an entry that does not begin with the
            bytes this template's checksum gives is not this template's (compiled again, and
            written anew); a code part that cannot be read back is as good as none."""
            try:
                with open(os.path.join(self.directory, self.pattern % bucket.key), "rb") as f:
                    data = f.read()
            except OSError:
                return
            head = bc_magic + pickle.dumps(bucket.checksum, 2)
            if not data.startswith(head):
                return
            try:
                bucket.code = marshal.loads(data[len(head) :])
            except (EOFError, ValueError, TypeError):
                bucket.reset()

        def dump_bytecode(self, bucket) -> None:
            try:
                os.makedirs(self.directory, exist_ok=True)
                super().dump_bytecode(bucket)
            except OSError:
                pass

    return Cache(str(local_cache.CACHE_DIR / "jinja"))


def render_unit(ctx: dict) -> str:
    return _templates().get_template("triton.service.j2").render(**ctx)


def unit_digest(text: str) -> str:
    """Short sha256 of a unit file's text: names its snapshot on the host."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def unit_path(settings: Settings) -> str:
    """Where the unit is on the host."""
    return f"/etc/systemd/system/{settings.get('triton_service')}.service"


def wanted_units(settings: Settings, count: int) -> list[tuple[str, str]]:
    """(path, text) of every unit the host should have: the single unit, or with triton_per_gpu
    one per GPU of ``count`` (tritonfleet.serving.per_gpu), by index."""
    return [(unit_path(g), render_unit(unit_context(g))) for g in instance_gets(settings, count)]


def units_digest(settings: Settings, count: int) -> str:
    """What names the host's units in its deploy history and `tritonfleet status`: the single
    unit's digest, or with triton_per_gpu the digest of the per-GPU units' texts one after the
    other by index (what ``cat`` of the files in that order gives)."""
    return unit_digest("".join(text for _, text in wanted_units(settings, count)))
