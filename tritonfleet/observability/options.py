"""What ``tritonfleet prometheus`` generates with (the scrape job's name, its interval, the rate
window of the rules and dashboard, where the files live on the Prometheus server, GPU health's
interval, Alertmanager and the quarantine receiver), checked."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..core.errors import UsageError
from ..inventory.roster import InventoryError

DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
JOB_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_-]*$")
ALERTMANAGER = re.compile(r"^(?:(https?)://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})/?$")


def alertmanager_url(value: str, option: str = "--alertmanager") -> str:
    """Alertmanager's address as every command takes it (``prometheus``, ``quarantine serve`` and
    ``unit``), HOST:PORT or http(s)://HOST:PORT, as one URL (``http://`` when no scheme is
    given). UsageError for anything else."""
    m = ALERTMANAGER.match(value.strip())
    if not m or not 0 < int(m.group(3)) < 65536:
        raise UsageError(f"{option} {value!r}: expected HOST:PORT or http(s)://HOST:PORT (e.g. 127.0.0.1:9093)")
    return f"{m.group(1) or 'http'}://{m.group(2)}:{int(m.group(3))}"


@dataclass(frozen=True)
class Options:
    job: str = "triton"
    scrape_interval: str = "15s"
    rate_window: str = "5m"
    #: where DIR lives on the Prometheus server (paths in the scrape job and prometheus.yml)
    prometheus_dir: str = ""
    #: GPU health (tritonfleet.observability.gpu_health_rules): scrape and evaluation interval,
    #: the Alertmanager Prometheus sends alerts to (HOST:PORT or http(s)://HOST:PORT), the
    #: quarantine receiver's URL and the token file Alertmanager sends it (credentials_file)
    health_interval: str = "5s"
    alertmanager: str = ""
    quarantine_url: str = ""
    quarantine_token_file: str = ""

    def check(self) -> None:
        if not JOB_NAME.match(self.job):
            raise InventoryError(f"--job {self.job!r}: letters, digits, '_' and '-' only")
        for opt, value in (("--scrape-interval", self.scrape_interval), ("--rate-window", self.rate_window)):
            if not DURATION.match(value):
                raise InventoryError(f"{opt} {value!r} is not a Prometheus duration (e.g. 15s, 5m)")
        if not DURATION.match(self.health_interval):
            raise InventoryError(f"--health-interval {self.health_interval!r} is not a Prometheus duration (e.g. 5s)")
        if self.alertmanager:
            self.alertmanager_url()
        if self.quarantine_url and not re.match(r"^https?://[^\s/]+", self.quarantine_url):
            raise InventoryError(f"--quarantine-url {self.quarantine_url!r}: expected http://host:port")
        if self.quarantine_url and not self.alertmanager:
            raise InventoryError(
                "--quarantine-url without --alertmanager: prometheus.yml would send no alert to "
                "Alertmanager, so nothing is ever quarantined; add --alertmanager HOST:PORT"
            )
        if self.quarantine_url and not self.quarantine_token_file:
            raise InventoryError(
                "--quarantine-url needs the receiver's token file as Alertmanager reads it "
                "(--quarantine-token-file PATH, or quarantine_token_file in group data)"
            )
        if duration_seconds(self.rate_window) < 4 * duration_seconds(self.scrape_interval):
            raise InventoryError(
                f"--rate-window {self.rate_window} must be at least 4 scrape intervals "
                f"({self.scrape_interval}) for rate() to see enough samples"
            )

    def alertmanager_url(self) -> str:
        """``alertmanager`` as a URL (alertmanager_url, the form ``quarantine serve
        --alertmanager`` takes too)."""
        try:
            return alertmanager_url(self.alertmanager)
        except UsageError as e:
            raise InventoryError(str(e)) from e


def duration_seconds(d: str) -> float:
    """Seconds of a Prometheus duration (``5m``, ``1h30m``)."""
    unit = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    return sum(float(n) * unit[u] for n, u in re.findall(r"([0-9]+)(ms|s|m|h|d|w|y)", d))
