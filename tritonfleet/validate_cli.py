"""``tritonfleet validate [REPO] [--json]``: exit 0 valid, 1 invalid, 2 usage error."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .cli import main


@main.command("validate")
@click.argument("repo", required=False, default="files/model_repository")
@click.option("--json", "as_json", is_flag=True, help="machine-readable result")
def validate_cmd(repo: str, as_json: bool) -> None:
    """Validate a Triton model repository the way tritonserver will (default: files/model_repository)."""
    from .validate import validate_repository

    path = Path(repo)
    if not path.is_dir():
        click.echo(f"tritonfleet validate: {repo}: no such directory", err=True)
        sys.exit(2)
    problems = validate_repository(path)
    models = sorted(d.name for d in path.iterdir() if d.is_dir() and not d.name.startswith("."))
    if as_json:
        click.echo(json.dumps({"repository": str(path), "valid": not problems, "models": models,
                               "problems": [p.as_dict() for p in problems]}, indent=2))
    else:
        for p in problems:
            click.echo(f"{path}/{p}", err=True)
        if not problems:
            click.echo(f"{path}: {len(models)} models valid ({', '.join(models)})")
        else:
            click.echo(f"{path}: {len(problems)} problem(s) in {len({p.model for p in problems})} model(s)", err=True)
    sys.exit(1 if problems else 0)
