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
    **{m: COLLECTOR for m in (
        GPU_INFO, GPU_COUNT, TEMPERATURE, MEMORY_TEMPERATURE, POWER_DRAW, POWER_LIMIT, SM_CLOCK, SM_CLOCK_MAX,
        CLOCKS_EVENT_REASONS, CLOCKS_EVENT_REASON_ACTIVE, PCIE_GENERATION, PCIE_GENERATION_MAX, PCIE_WIDTH,
        PCIE_WIDTH_MAX, ECC_MODE, ECC_ERRORS, RETIRED_PAGES, RETIRED_PAGES_PENDING, REMAPPED_ROWS,
        REMAPPED_ROWS_PENDING, REMAPPED_ROWS_FAILURE, QUERY_SUCCESS, QUERY_DURATION, XID_ERRORS, XID_LAST,
        KERNEL_LOG_READABLE)},
    **{m: PROBE for m in (PROBE_UP, PROBE_MODELS, PROBE_SUCCESS, PROBE_LATENCY, PROBE_FAILURES,
                          PROBE_LAST_SUCCESS)},
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


ALERTS: tuple[Alert, ...] = (
    Alert("GpuXidCritical", (XID_ERRORS,), "critical", "0s", quarantine=True),
    Alert("GpuXid", (XID_LAST,), "warning", "0s"),
    Alert("GpuEccUncorrectable", (ECC_ERRORS,), "critical", "0s", quarantine=True),
    Alert("GpuRowRemapFailure", (REMAPPED_ROWS_FAILURE,), "critical", "0s", quarantine=True),
    Alert("GpuRowRemapPending", (REMAPPED_ROWS_PENDING,), "warning", "0s"),
    Alert("GpuRetiredPagesPending", (RETIRED_PAGES_PENDING,), "warning", "0s"),
    Alert("GpuHardwareSlowdown", (CLOCKS_EVENT_REASON_ACTIVE,), "warning", "5m"),
    Alert("GpuThermalSlowdown", (CLOCKS_EVENT_REASON_ACTIVE,), "warning", "5m"),
    Alert("GpuTemperatureHigh", (TEMPERATURE,), "warning", "5m"),
    Alert("GpuPcieLinkDegraded", (PCIE_WIDTH, PCIE_WIDTH_MAX, PCIE_GENERATION, PCIE_GENERATION_MAX,
                                  CLOCKS_EVENT_REASON_ACTIVE), "warning", "10m"),
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
