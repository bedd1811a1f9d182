"""tritonfleet: pyinfra deploys that take bare NVIDIA GPU hosts to serving Triton."""

from pathlib import Path

__version__ = "0.1.0"

#: Repository root (deploys/, inventories/, templates/, files/ live here).
ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "templates"
FILES = ROOT / "files"
