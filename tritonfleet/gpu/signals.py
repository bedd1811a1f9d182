"""The GPU and host health signals: every metric the GPU collector and the inference probe write,
and every alert of the health rules with the metrics it reads, its severity, its ``for`` and
whether it quarantines the host.

The collector (tritonfleet.gpu.telemetry), the probe (tritonfleet.observability.inference_probe)
and the rule generator (tritonfleet.observability.gpu_health_rules) take the names from here, so
a metric name is written once; tests/unit/gpu/test_signals.py checks that every metric an alert
reads is one its writer really writes. Standard library only: steps/telemetry.py puts this file
on the host next to the two scripts, which load it from there (``SPEC_FILE``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: the name of this file's copy on the host, next to the collector and the probe
SPEC_FILE = "gpu_signals.py"

# the writers
COLLECTOR = "tritonfleet-gpu-telemetry"  # tritonfleet/gpu/telemetry.py
PROBE = "tritonfleet-inference-probe"  # tritonfleet/observability/inference_probe.py
NODE_EXPORTER = "prometheus-node-exporter"  # its textfile collector's own series
PROMETHEUS = "prometheus"  # the scrape's ``up``

GPU_PREFIX = "tritonfleet_gpu_"
PROBE_PREFIX = "tritonfleet_inference_probe_"

# written by the collector: the driver query (nvidia-smi, per GPU) ...
GPU_INFO = GPU_PREFIX + "info"
GPU_COUNT = GPU_PREFIX + "count"
TEMPERATURE = GPU_PREFIX + "temperature_celsius"
MEMORY_TEMPERATURE = GPU_PREFIX + "memory_temperature_celsius"
POWER_DRAW = GPU_PREFIX + "power_draw_watts"
POWER_LIMIT = GPU_PREFIX + "power_limit_watts"
SM_CLOCK = GPU_PREFIX + "sm_clock_hertz"
SM_CLOCK_MAX = GPU_PREFIX + "sm_clock_max_hertz"
CLOCKS_EVENT_REASONS = GPU_PREFIX + "clocks_event_reasons"
CLOCKS_EVENT_REASON_ACTIVE = GPU_PREFIX + "clocks_event_reason_active"
PCIE_GENERATION = GPU_PREFIX + "pcie_link_generation"
PCIE_GENERATION_MAX = GPU_PREFIX + "pcie_link_generation_max"
PCIE_WIDTH = GPU_PREFIX + "pcie_link_width"
PCIE_WIDTH_MAX = GPU_PREFIX + "pcie_link_width_max"
ECC_MODE = GPU_PREFIX + "ecc_mode_enabled"
ECC_ERRORS = GPU_PREFIX + "ecc_errors_total"
RETIRED_PAGES = GPU_PREFIX + "retired_pages"
RETIRED_PAGES_PENDING = GPU_PREFIX + "retired_pages_pending"
REMAPPED_ROWS = GPU_PREFIX + "remapped_rows"
REMAPPED_ROWS_PENDING = GPU_PREFIX + "remapped_rows_pending"
REMAPPED_ROWS_FAILURE = GPU_PREFIX + "remapped_rows_failure"
QUERY_SUCCESS = GPU_PREFIX + "query_success"
QUERY_DURATION = GPU_PREFIX + "query_duration_seconds"
# ... and the kernel's messages (Xid reports)
XID_ERRORS = GPU_PREFIX + "xid_errors_total"
XID_EVENTS = GPU_PREFIX + "xid_events_total"
XID_STANDING = GPU_PREFIX + "xid_standing"
XID_LAST = GPU_PREFIX + "xid_last_timestamp_seconds"
KERNEL_LOG_READABLE = GPU_PREFIX + "kernel_log_readable"

# written by the inference probe (per Triton port, per model)
PROBE_UP = PROBE_PREFIX + "up"
PROBE_MODELS = PROBE_PREFIX + "models"
PROBE_SUCCESS = PROBE_PREFIX + "success"
PROBE_LATENCY = PROBE_PREFIX + "latency_seconds"
PROBE_FAILURES = PROBE_PREFIX + "consecutive_failures"
PROBE_LAST_SUCCESS = PROBE_PREFIX + "last_success_timestamp_seconds"

# written by others: the node exporter's textfile collector, Prometheus's scrape
TEXTFILE_MTIME = "node_textfile_mtime_seconds"
TEXTFILE_SCRAPE_ERROR = "node_textfile_scrape_error"
SCRAPE_UP = "up"

#: metric -> what writes it
WRITERS: dict[str, str] = {
    **{
        m: COLLECTOR
        for m in (
            GPU_INFO,
            GPU_COUNT,
            TEMPERATURE,
            MEMORY_TEMPERATURE,
            POWER_DRAW,
            POWER_LIMIT,
            SM_CLOCK,
            SM_CLOCK_MAX,
            CLOCKS_EVENT_REASONS,
            CLOCKS_EVENT_REASON_ACTIVE,
            PCIE_GENERATION,
            PCIE_GENERATION_MAX,
            PCIE_WIDTH,
            PCIE_WIDTH_MAX,
            ECC_MODE,
            ECC_ERRORS,
            RETIRED_PAGES,
            RETIRED_PAGES_PENDING,
            REMAPPED_ROWS,
            REMAPPED_ROWS_PENDING,
            REMAPPED_ROWS_FAILURE,
            QUERY_SUCCESS,
            QUERY_DURATION,
            XID_ERRORS,
            XID_EVENTS,
            XID_STANDING,
            XID_LAST,
            KERNEL_LOG_READABLE,
        )
    },
    **{m: PROBE for m in (PROBE_UP, PROBE_MODELS, PROBE_SUCCESS, PROBE_LATENCY, PROBE_FAILURES, PROBE_LAST_SUCCESS)},
    TEXTFILE_MTIME: NODE_EXPORTER,
    TEXTFILE_SCRAPE_ERROR: NODE_EXPORTER,
    SCRAPE_UP: PROMETHEUS,
}


@dataclass(frozen=True)
class Alert:
    """One alert of the health rules: the metrics its expression reads, its ``severity`` label,
    how long the expression must hold (``for_``), and whether it quarantines the host."""

    name: str
    reads: tuple[str, ...]
    severity: str
    for_: str
    quarantine: bool = False


# What the health rules do with an Xid, by the immediate action NVIDIA's Xid catalog recommends
# for it (the collector's ``action`` label, from tritonfleet/data/xid_catalog.json): the alert it
# raises, or None (the catalog says to ignore it).
XID_QUARANTINE, XID_SUPPORT, XID_WARNING = "GpuXidCritical", "GpuXidSupport", "GpuXid"
XID_ACTIONS: dict[str, str | None] = {
    # the GPU is out of service until it is reset, the machine rebooted or its hardware seen to
    "RESET_GPU": XID_QUARANTINE,
    "RESTART_BM": XID_QUARANTINE,  # reboot the bare-metal machine
    "RESTART_VM": XID_QUARANTINE,
    "WORKFLOW_XID_48": XID_QUARANTINE,  # double-bit ECC: "a GPU reset or node reboot is needed"
    "WORKFLOW_NVLINK_ERR": XID_QUARANTINE,  # Xid 74: "a GPU reset or node reboot is needed"
    "CHECK_MECHANICALS": XID_QUARANTINE,  # Xid 54: auxiliary power not connected
    # an Xid NVIDIA lists as unused on these GPUs, or says to take to support
    "CONTACT_SUPPORT": XID_SUPPORT,
    # the application's, or advice the rules cannot follow by themselves
    "RESTART_APP": XID_WARNING,
    "WORKFLOW_XID_45": XID_WARNING,  # a breadcrumb of another Xid's teardown
    "WORKFLOW_NVLINK5_ERR": XID_WARNING,  # its action depends on a subcode the rules do not decode
    "UPDATE_SWFW": XID_WARNING,
    "CHECK_UVM": XID_WARNING,
    "XID_154": XID_WARNING,  # names the recovery action of another Xid
    "NONE_GIVEN": XID_WARNING,  # the catalog's row has no resolution bucket
    "UNKNOWN": XID_WARNING,  # not in the catalog (a newer driver's Xid)
    "IGNORE": None,
}


def xid_actions(alert: str) -> list[str]:
    """The catalog actions whose Xids raise ``alert``, sorted."""
    return sorted(a for a, name in XID_ACTIONS.items() if name == alert)


ALERTS: tuple[Alert, ...] = (
    Alert("GpuXidCritical", (XID_STANDING,), "critical", "0s", quarantine=True),
    Alert("GpuXidRepeated", (XID_EVENTS, XID_LAST), "critical", "0s", quarantine=True),
    Alert("GpuXidSupport", (XID_STANDING,), "critical", "0s"),
    Alert("GpuXid", (XID_LAST, XID_STANDING), "warning", "0s"),
    Alert("GpuEccUncorrectable", (ECC_ERRORS,), "critical", "0s", quarantine=True),
    Alert("GpuRowRemapFailure", (REMAPPED_ROWS_FAILURE,), "critical", "0s", quarantine=True),
    Alert("GpuRowRemapPending", (REMAPPED_ROWS_PENDING,), "warning", "0s"),
    Alert("GpuRetiredPagesPending", (RETIRED_PAGES_PENDING,), "warning", "0s"),
    Alert("GpuHardwareSlowdown", (CLOCKS_EVENT_REASON_ACTIVE,), "warning", "5m"),
    Alert("GpuThermalSlowdown", (CLOCKS_EVENT_REASON_ACTIVE,), "warning", "5m"),
    Alert("GpuTemperatureHigh", (TEMPERATURE,), "warning", "5m"),
    Alert(
        "GpuPcieLinkDegraded",
        (PCIE_WIDTH, PCIE_WIDTH_MAX, PCIE_GENERATION, PCIE_GENERATION_MAX, CLOCKS_EVENT_REASON_ACTIVE),
        "warning",
        "10m",
    ),
    Alert("GpuQueryFailing", (QUERY_SUCCESS,), "critical", "1m"),
    Alert("GpuKernelLogUnreadable", (KERNEL_LOG_READABLE,), "warning", "5m"),
    Alert("GpuTelemetryDown", (SCRAPE_UP,), "warning", "2m"),
    Alert("GpuTelemetryStale", (TEXTFILE_MTIME, SCRAPE_UP), "warning", "2m"),
    Alert("TritonInferenceProbeStale", (TEXTFILE_MTIME, SCRAPE_UP), "warning", "2m"),
    Alert("TextfileUnreadable", (TEXTFILE_SCRAPE_ERROR,), "warning", "5m"),
    Alert("TritonInferenceProbeFailing", (PROBE_FAILURES,), "critical", "0s", quarantine=True),
    Alert("TritonInferenceProbeSlow", (PROBE_LATENCY,), "warning", "5m"),
    Alert("TritonInferenceProbeNoAnswer", (PROBE_UP,), "warning", "2m"),
)
ALERT = {a.name: a for a in ALERTS}
