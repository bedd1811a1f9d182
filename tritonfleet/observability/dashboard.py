"""The Grafana dashboard for the fleet (JSON model, schemaVersion 39, Grafana 10/11).

Per model: requests/s, failures/s by reason, mean request time, queue vs compute time per
request, batch efficiency (inference_count / exec_count: the mean dynamic batch size) and
pending requests. Per host: Triton up, requests/s, GPU utilization, GPU memory used and total.
Variables: data source, group, host, model. Every query is plain PromQL on Triton's own metrics
(no recording rule needed), so the dashboard works on any Prometheus that scrapes the job.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .options import Options

DS = {"type": "prometheus", "uid": "${datasource}"}
#: Grafana's variables in the queries, and what a test may put in their place to run them.
VARIABLES = ("$group", "$host", "$model", "$__rate_interval")


def _variable(name: str, label: str, query: str) -> dict:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-variable"},
        "refresh": 2,  # on time range change
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "hide": 0,
    }


def dashboard(opts: Options) -> dict:
    job = f'job="{opts.job}"'
    hostsel = f'{job}, group=~"$group", host=~"$host"'
    sel = f'{hostsel}, model=~"$model"'
    r = "$__rate_interval"

    def rate(metric: str, s: str = sel) -> str:
        return f"rate({metric}{{{s}}}[{r}])"

    def per_model(metric: str) -> str:
        return f"sum by (model) ({rate(metric)})"

    success = per_model("nv_inference_request_success")
    compute = " + ".join(rate(f"nv_inference_compute_{p}_duration_us") for p in ("input", "infer", "output"))
    panels: list[dict] = []
    at = {"x": 0, "y": 0, "h": 0}  # where the next panel goes; h: height of the current line

    def newline() -> None:
        at["y"], at["x"], at["h"] = at["y"] + at["h"], 0, 0

    def row(title: str) -> None:
        newline()
        panels.append(
            {
                "type": "row",
                "title": title,
                "collapsed": False,
                "panels": [],
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": at["y"]},
            }
        )
        at["h"] = 1
        newline()

    def panel(
        title: str,
        description: str,
        unit: str,
        targets: list[tuple[str, str]],
        kind: str = "timeseries",
        width: int = 12,
        height: int = 8,
    ) -> None:
        if at["x"] + width > 24:
            newline()
        x, y = at["x"], at["y"]
        at["x"], at["h"] = x + width, max(at["h"], height)
        p = {
            "type": kind,
            "title": title,
            "description": description,
            "datasource": DS,
            "gridPos": {"h": height, "w": width, "x": x, "y": y},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [
                {"refId": chr(ord("A") + i), "datasource": DS, "expr": expr, "legendFormat": legend, "range": True}
                for i, (expr, legend) in enumerate(targets)
            ],
        }
        if kind == "timeseries":
            p["options"] = {
                "legend": {
                    "displayMode": "table",
                    "placement": "bottom",
                    "showLegend": True,
                    "calcs": ["mean", "max", "lastNotNull"],
                },
                "tooltip": {"mode": "multi", "sort": "desc"},
            }
        panels.append(p)

    row("Models")
    panel(
        "Requests/s",
        "Successful inference requests per second (nv_inference_request_success).",
        "reqps",
        [(success, "{{model}}")],
    )
    panel(
        "Failures/s",
        "Failed requests per second by reason (nv_inference_request_failure).",
        "reqps",
        [(f"sum by (model, reason) ({rate('nv_inference_request_failure')})", "{{model}} {{reason}}")],
    )
    panel(
        "Mean request time",
        "Mean time per successful request, queue + compute "
        "(rate of nv_inference_request_duration_us / rate of requests; a mean, not a percentile).",
        "ms",
        [(f"{per_model('nv_inference_request_duration_us')} / {success} / 1000", "{{model}}")],
    )
    panel(
        "Queue vs compute time per request",
        "Mean queue time (nv_inference_queue_duration_us) "
        "against mean compute time (input + infer + output). Queue above compute while the GPU "
        "stays under 40% busy: lower max_queue_delay_microseconds.",
        "ms",
        [
            (f"{per_model('nv_inference_queue_duration_us')} / {success} / 1000", "{{model}} queue"),
            (f"sum by (model) ({compute}) / {success} / 1000", "{{model}} compute"),
        ],
    )
    panel(
        "Batch efficiency",
        "Inferences per model execution (nv_inference_count / "
        "nv_inference_exec_count): the mean batch the dynamic batcher forms. 1 = no batching.",
        "none",
        [(f"{per_model('nv_inference_count')} / {per_model('nv_inference_exec_count')}", "{{model}}")],
    )
    panel(
        "Pending requests",
        "Requests waiting for execution (nv_inference_pending_request_count).",
        "none",
        [(f"sum by (model) (nv_inference_pending_request_count{{{sel}}})", "{{model}}")],
    )
    row("Hosts")
    panel(
        "Triton up",
        "1: Prometheus scrapes the host's Triton metrics endpoint; 0: it does not.",
        "none",
        [(f"up{{{hostsel}}}", "{{host}}")],
        kind="stat",
        width=24,
        height=4,
    )
    panel(
        "Requests/s per host",
        "Successful requests per second, all models.",
        "reqps",
        [(f"sum by (host) ({rate('nv_inference_request_success')})", "{{host}}")],
    )
    panel(
        "GPU utilization",
        "nv_gpu_utilization, mean over the host's GPUs (0-100%).",
        "percentunit",
        [(f"avg by (host) (nv_gpu_utilization{{{hostsel}}})", "{{host}}")],
    )
    panel(
        "GPU memory used",
        "nv_gpu_memory_used_bytes against nv_gpu_memory_total_bytes, per GPU.",
        "bytes",
        [
            (f"sum by (host, gpu_uuid) (nv_gpu_memory_used_bytes{{{hostsel}}})", "{{host}} {{gpu_uuid}} used"),
            (f"sum by (host, gpu_uuid) (nv_gpu_memory_total_bytes{{{hostsel}}})", "{{host}} {{gpu_uuid}} total"),
        ],
    )
    panel(
        "GPU memory used (share)",
        "Used share of each GPU's memory; the alert fires above monitor_gpu_memory_ratio.",
        "percentunit",
        [(f"nv_gpu_memory_used_bytes{{{hostsel}}} / nv_gpu_memory_total_bytes{{{hostsel}}}", "{{host}} {{gpu_uuid}}")],
    )
    for i, p in enumerate(panels, 1):
        p["id"] = i
    return {
        "id": None,
        "uid": f"tritonfleet-{opts.job}"[:40],
        "title": f"Triton fleet ({opts.job})",
        "description": "Generated by `tritonfleet prometheus` from the inventory.",
        "tags": ["triton", "tritonfleet"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "annotations": {"list": []},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                },
                _variable("group", "Group", f"label_values(up{{{job}}}, group)"),
                _variable("host", "Host", f'label_values(up{{{job}, group=~"$group"}}, host)'),
                _variable(
                    "model", "Model", f'label_values(nv_inference_request_success{{{job}, host=~"$host"}}, model)'
                ),
            ]
        },
        "panels": panels,
    }


def queries(dash: dict) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and of every query variable (the selector inside
    Grafana's label_values(...))."""
    out = []
    for p in dash["panels"]:
        for t in p.get("targets", []):
            out.append((f"panel {p['id']} '{p['title']}' {t['refId']}", t["expr"]))
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"]
            if not (q.startswith("label_values(") and q.endswith(")")):
                raise ValueError(f"variable {v['name']}: not a label_values() query: {q}")
            selector = q[len("label_values(") : -1].rsplit(",", 1)[0]
            out.append((f"variable {v['name']}", selector))
    return out
