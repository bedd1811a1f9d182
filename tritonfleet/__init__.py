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

#: The source checkout this module was imported from (its tests, bench/ and docs/ use it). In an
#: installed wheel it is the site-packages directory: the package itself never reads through it.
ROOT = Path(__file__).resolve().parent.parent


def _quiet_relaxed_host_keys() -> None:
    """pyinfra warns "No host key for <address> found in known_hosts" on every connection when
    ssh_strict_host_key_checking is "off"/"no" (its WarningPolicy): the inventory chose that on
    purpose (the testbed's hosts share one image's host keys), so the warning is dropped. Strict
    mode logs its refusal as an error and accept-new in other words: both still show."""
    import logging

    class RelaxedHostKeys(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return not (record.levelno == logging.WARNING
                        and record.msg == "No host key for %s found in known_hosts")

    log = logging.getLogger("pyinfra")
    if not any(type(f).__name__ == "RelaxedHostKeys" for f in log.filters):
        log.addFilter(RelaxedHostKeys())


_quiet_relaxed_host_keys()
