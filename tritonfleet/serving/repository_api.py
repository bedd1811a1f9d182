"""Triton's model repository API on a host (``triton_model_control_mode = "explicit"``): which
models a release switch loads and unloads, and the curl calls that do it on the host, through
the restricted-API key. Used by the Triton service step and by the rollback."""

from __future__ import annotations

from ..core.shell import q, url_segment
from ..settings.access import Settings
from . import apikey


def model_diff(old_man: dict, new_man: dict) -> tuple[list[str], list[str]]:
    """(models to load, models to unload) going from one release manifest to another."""

    def by_model(man: dict) -> dict[str, dict]:
        out: dict[str, dict] = {}
        for path, value in man.items():
            if "/" in path:  # a file at the top of the repository is no model
                out.setdefault(path.split("/", 1)[0], {})[path] = value
        return out

    old, new = by_model(old_man), by_model(new_man)
    return [m for m in sorted(new) if new[m] != old.get(m)], [m for m in sorted(old) if m not in new]


def repository_api_commands(settings: Settings, load: list[str], unload: list[str], port: int | None = None) -> str:
    """curl calls to Triton's repository API on the host; the first failure stops with Triton's
    answer (a failed load leaves the model that was loaded serving). ``port``: a per-GPU
    instance's HTTP port (default triton_http_port)."""
    url = f"http://{api_address(settings)}:{port or settings.get('triton_http_port')}/v2/repository/models"
    repo = f"{settings.get('triton_base_dir')}/model_repository"
    calls = [(m, "unload") for m in unload] + [(m, "load") for m in load]
    return (
        "; ".join(
            # Triton reloads a loaded model (and each version of it) only when its directories look
            # newer than at the last load; a release switched back to is older, so the model's
            # directories (never its files: files are shared with other releases) are touched first.
            (f"find {q(repo + '/' + m)} -type d -exec touch -c {{}} + && " if verb == "load" else "")
            + apikey.curl(
                settings.get("triton_api_key_file"),
                f"-sS -m 600 --fail-with-body -X POST {q(url + '/' + url_segment(m) + '/' + verb)}",
            )
            + " >&2 "
            f"|| {{ echo {q(f'repository API: {verb} of {m} failed (the model that was loaded keeps serving)')} >&2; "
            "exit 1; }"
            for m, verb in calls
        )
        or "true"
    )


def api_address(settings: Settings) -> str:
    bind = settings.get("triton_http_bind")
    return bind if bind and bind not in ("0.0.0.0", "::") else "127.0.0.1"
