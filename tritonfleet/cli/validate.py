"""``tritonfleet validate [REPO] [--json]``: exit 0 valid, 1 invalid, 2 usage error.

REPO defaults to files/model_repository under the current directory. Each problem is printed on
a line of its own as ``REPO/model/file:line: [rule] message``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..core.errors import UsageError

DEFAULT_REPOSITORY = "files/model_repository"


@click.command("validate")
@click.argument("repo", required=False, default=DEFAULT_REPOSITORY)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option(
    "--gpus",
    type=click.IntRange(min=0),
    default=None,
    help="GPUs per host: KIND_GPU instances and gpu ids are checked against it.",
)
@click.option(
    "--backend",
    "backends",
    multiple=True,
    metavar="NAME",
    help="A backend the Triton image has beyond the standard ones (repeatable).",
)
def validate_cmd(repo: str, as_json: bool, gpus: int | None, backends: tuple[str, ...]) -> None:
    """Validate a Triton model repository the way tritonserver loads it.

    REPO defaults to files/model_repository. Exit status: 0 valid, 1 invalid, 2 usage error.
    """
    from ..model_repo.validate import list_models, validate_repository

    path = Path(repo)
    if not path.exists():
        raise UsageError(f"{repo}: no such directory")
    if not path.is_dir():
        raise UsageError(f"{repo}: not a directory")
    problems = validate_repository(path, gpus=gpus, backends=backends)
    models = list_models(path)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "repository": str(path),
                    "valid": not problems,
                    "models": models,
                    "problems": [p.as_dict() | {"path": p.path} for p in problems],
                },
                indent=2,
            )
        )
    else:
        for p in problems:
            click.echo(f"{path}/{p}")
        if problems:
            bad = sorted({p.model for p in problems if p.model})
            click.echo(
                f"{path}: invalid: {len(problems)} problem(s)" + (f" in {', '.join(bad)}" if bad else ""), err=True
            )
        else:
            click.echo(f"{path}: valid: {len(models)} model(s): {', '.join(models)}")
    sys.exit(1 if problems else 0)
