"""tritonfleet: pyinfra deploys that take bare NVIDIA GPU hosts to serving Triton."""

from importlib import resources
from pathlib import Path

__version__ = "0.1.0"


def resource(*parts: str) -> Path:
    """A file the package ships (templates/, data/, skeleton/), wherever it is installed.

    Every path to shipped data goes through here. The package is installed as files (a wheel,
    or an editable install of a checkout), never imported from a zip archive, so the answer is
    a plain path."""
    return Path(str(resources.files(__name__).joinpath(*parts)))


TEMPLATES = resource("templates")
#: What `tritonfleet init` writes into an operator's repository: the entry points (deploys/), the
#: inventory and its group data, the model repository, a README.
SKELETON = resource("skeleton")
#: The rollback entry point `tritonfleet rollout` runs for a host that failed its batch.
ROLLBACK_DEPLOY = SKELETON / "deploys" / "rollback.py"
#: The staging entry point `tritonfleet rollout --stage` runs on every target before the first batch.
STAGE_DEPLOY = SKELETON / "deploys" / "stage.py"

#: The source checkout this module was imported from (its tests, bench/ and docs/ use it). In an
#: installed wheel it is the site-packages directory: the package itself never reads through it.
ROOT = Path(__file__).resolve().parent.parent
