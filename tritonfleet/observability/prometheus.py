"""Prometheus for the fleet, generated from the inventory: file_sd target files, the scrape job,
recording and alerting rules, and a Grafana dashboard (tritonfleet.observability.dashboard).

Layout written by :func:`write` (``tritonfleet prometheus INVENTORY --out DIR``)::

    DIR/targets/<job>-<group>.json   file_sd targets, one file per inventory group
    DIR/scrape-<job>.yml             the scrape job (paste under scrape_configs:)
    DIR/rules/<job>.rules.yml        recording and alerting rules (rule_files:)
    DIR/prometheus.yml               a complete configuration using the three above
    DIR/grafana/<job>-fleet.json     the dashboard
    DIR/.tritonfleet-prometheus.json what this command wrote there: each file and its sha256

The command owns only what it wrote (:func:`plan`): a file in its way that the record does not
list with its present content (an operator's own prometheus.yml, a target file written by hand,
a generated file edited since) is never replaced unless ``--force``, and never removed. With
``--limit`` only the named hosts' entries of the target files change; every other host's entry
stays where it was, so no host stops being monitored.

Every target carries the labels ``host`` (inventory name), ``gpu_class`` and ``group``; a host with
one Triton per GPU (``triton_per_gpu``) is one target per GPU, each with the label ``gpu`` (its index).
Latency figures come from Triton's cumulative ``_us`` counters: rate(duration) / rate(count) is
the mean over the window, not a percentile (Triton exports no histogram, and its summaries are
off by default and cannot be aggregated across hosts).

Thresholds are tunables (``monitor_*``), per host like every tunable: when hosts differ, each
value gets its own rule restricted to its hosts by a ``host=~`` matcher, and a label naming the
tunable and its value (rules of one name need labels of their own: ``promtool check rules``
reports rules with the same name and labels as duplicates).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import UsageError
from ..inventory.roster import FleetHost, InventoryError
from ..model_repo.validate import list_models
from . import dashboard, metrics
from .options import Options, duration_seconds
from .rule_text import alert, host_regex, number, yaml_file

#: the record of what the command wrote into DIR (relative path -> sha256 of each version written)
RECORD = ".tritonfleet-prometheus.json"
#: the folders of file_sd target files: the Triton job's and the GPU health job's
#: (tritonfleet.observability.gpu_health_rules), each ``<job>-<group>.json``
TARGET_DIRS = ("targets", "targets/health")

# ---- targets ---------------------------------------------------------------------------------


@dataclass
class ScrapeTarget:
    host: FleetHost
    target: str
    labels: dict[str, str]


def targets(hosts: list[FleetHost]) -> tuple[list[ScrapeTarget], list[str]]:
    """Scrape targets of every host (inventory order), and warnings about hosts Prometheus may
    not reach."""
    out: list[ScrapeTarget] = []
    warnings: list[str] = []
    seen: dict[str, str] = {}
    for h in hosts:
        for target, gpu in metrics.metrics_targets(h):
            if target in seen:
                raise InventoryError(
                    f"{h.name}: metrics endpoint {target} is also {seen[target]}'s: "
                    "set health_host or ssh_hostname so each host has its own address"
                )
            seen[target] = h.name + (f" GPU {gpu}" if gpu is not None else "")
            labels = {"host": h.name}
            if h.gpu_class:
                labels["gpu_class"] = h.gpu_class
            if h.group:
                labels["group"] = h.group
            if gpu is not None:  # one Triton per GPU (triton_per_gpu): the instance's GPU
                labels["gpu"] = str(gpu)
            out.append(ScrapeTarget(h, target, labels))
        bind = h.get("triton_metrics_bind")
        if bind and bind.startswith("127."):
            warnings.append(
                f"{h.name}: triton_metrics_bind={bind}: the metrics port listens on "
                "loopback only, Prometheus cannot scrape it (widen triton_metrics_bind)"
            )
        if h.get("health_via") == "ssh":
            warnings.append(
                f"{h.name}: health_via=ssh: Prometheus scrapes {metrics.metrics_target(h)} directly; "
                "open the metrics port to the Prometheus server"
            )
    return out, warnings


def file_sd(ts: list[ScrapeTarget], job: str) -> dict[str, list[dict]]:
    """file name -> file_sd content (one file per group, one entry per host)."""
    files: dict[str, list[dict]] = {}
    for t in ts:
        group = t.labels.get("group", "ungrouped")
        files.setdefault(f"{job}-{group}.json", []).append({"targets": [t.target], "labels": t.labels})
    return files


def scrape_job(opts: Options, base: str) -> dict:
    return {
        "job_name": opts.job,
        "scrape_interval": opts.scrape_interval,
        "scrape_timeout": opts.scrape_interval if duration_seconds(opts.scrape_interval) < 10 else "10s",
        "metrics_path": "/metrics",
        "file_sd_configs": [{"files": [f"{base}/targets/{opts.job}-*.json"], "refresh_interval": "1m"}],
    }


# ---- rules -----------------------------------------------------------------------------------


def _partitions(hosts: list[FleetHost], keys: tuple[str, ...]) -> list[tuple[tuple, str, dict[str, str]]]:
    """[(values of ``keys``, extra matcher, extra labels)]: one entry when every host has the
    same values (no matcher, no labels), else one per distinct set of values, restricted to its
    hosts and labelled with them (:func:`_threshold_labels`)."""
    groups: dict[str, tuple[tuple, list[str]]] = {}
    for h in hosts:
        values = tuple(h.get(k) for k in keys)
        for k, v in zip(keys, values, strict=True):
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise InventoryError(f"{h.name}: tunable {k} = {v!r} must be a number >= 0 (group data)")
        groups.setdefault(json.dumps(values), (values, []))[1].append(h.name)
    if len(groups) == 1:
        return [(next(iter(groups.values()))[0], "", {})]
    return [
        (values, f", host=~`{host_regex(names)}`", _threshold_labels(keys, values)) for values, names in groups.values()
    ]


def _threshold_labels(keys: tuple[str, ...], values: tuple) -> dict[str, str]:
    """Labels for one partition's rule, when the hosts' thresholds differ: each tunable and its
    value. promtool check rules reports rules of one name with the same labels as duplicates
    ("Might cause inconsistency while recording expressions"), whatever their expressions."""
    return {k: number(v) for k, v in zip(keys, values, strict=True)}


def recording_rules(opts: Options) -> list[dict]:
    j, w = f'job="{opts.job}"', opts.rate_window

    def rate(metric: str) -> str:
        return f"rate({metric}{{{j}}}[{w}])"

    compute = " + ".join(rate(f"nv_inference_compute_{p}_duration_us") for p in ("input", "infer", "output"))
    rules = [
        (f"triton_model:requests:rate{w}", rate("nv_inference_request_success")),
        (f"triton_model:failures:rate{w}", f"sum without (reason) ({rate('nv_inference_request_failure')})"),
        (
            f"triton_model:failure_ratio:rate{w}",
            f"triton_model:failures:rate{w} / (triton_model:failures:rate{w} + triton_model:requests:rate{w})",
        ),
        (
            f"triton_model:request_duration_us:mean{w}",
            f"{rate('nv_inference_request_duration_us')} / {rate('nv_inference_request_success')}",
        ),
        (
            f"triton_model:queue_duration_us:mean{w}",
            f"{rate('nv_inference_queue_duration_us')} / {rate('nv_inference_request_success')}",
        ),
        (f"triton_model:compute_duration_us:mean{w}", f"({compute}) / {rate('nv_inference_request_success')}"),
        (f"triton_model:batch_size:mean{w}", f"{rate('nv_inference_count')} / {rate('nv_inference_exec_count')}"),
        (
            f"triton_host:gpu_utilization:avg{w}",
            f"avg without (gpu_uuid) (avg_over_time(nv_gpu_utilization{{{j}}}[{w}]))",
        ),
        ("triton_gpu:memory_used:ratio", f"nv_gpu_memory_used_bytes{{{j}}} / nv_gpu_memory_total_bytes{{{j}}}"),
    ]
    return [{"record": name, "expr": expr} for name, expr in rules]


def alerting_rules(opts: Options, hosts: list[FleetHost], models: dict[str, list[str]]) -> list[dict]:
    """Alerts; ``models``: model -> hosts expected to serve it (their model repository)."""
    j, w = f'job="{opts.job}"', opts.rate_window
    on = "{{ $labels.host }} ({{ $labels.instance }})"
    rules = [
        alert(
            "TritonDown",
            f"up{{{j}}} == 0",
            "2m",
            "critical",
            f"Triton on {on} does not answer on its metrics port",
            "Prometheus cannot scrape the host's Triton metrics endpoint: the container or the host is "
            "down, or the port is closed. Check `systemctl status triton` and its journal on the host.",
        )
    ]
    everyone = sorted(h.name for h in hosts)
    for model, names in sorted(models.items()):
        sel = "" if sorted(names) == everyone else f", host=~`{host_regex(sorted(names))}`"
        rules.append(
            alert(
                "TritonModelNotReady",
                f"label_replace((up{{{j}{sel}}} == 1) unless on (instance) "
                f'nv_inference_request_success{{{j}, model="{model}"}}, "model", "{model}", "", "")',
                "2m",
                "critical",
                f"{model} is not loaded on {on}",
                "Triton answers but reports no metrics for the model (Triton drops a model's "
                "nv_inference_request_success when it is not loaded): it failed to load or was unloaded. "
                f"Check GET /v2/models/{model}/ready and the Triton log.",
                {"model": model},
            )
        )
    for (ratio,), sel, extra in _partitions(hosts, ("monitor_failure_ratio",)):
        rules.append(
            alert(
                "TritonModelFailures",
                f"triton_model:failure_ratio:rate{w}{{{j}{sel}}} > {number(ratio)}",
                "5m",
                "warning",
                f"{{{{ $labels.model }}}} fails {{{{ $value | humanizePercentage }}}} of requests on {on}",
                f"More than {number(ratio * 100)}% of the model's requests failed over {w} "
                "(nv_inference_request_failure by reason).",
                extra,
            )
        )
    for (ms,), sel, extra in _partitions(hosts, ("monitor_latency_ms",)):
        rules.append(
            alert(
                "TritonModelSlow",
                f"triton_model:request_duration_us:mean{w}{{{j}{sel}}} > {number(ms * 1000)}",
                "10m",
                "warning",
                f'{{{{ $labels.model }}}} on {on} takes {{{{ $value | printf "%.0f" }}}} us a request',
                f"The mean request time (queue + compute) over {w} is above {number(ms)} ms. It is a mean from "
                "Triton's cumulative _us counters (rate(duration) / rate(count)), not a percentile.",
                extra,
            )
        )
    for (ratio,), sel, extra in _partitions(hosts, ("monitor_queue_compute_ratio",)):
        factor = "" if ratio == 1 else f"{number(ratio)} * "
        rules.append(
            alert(
                "TritonQueueDominates",
                f"triton_model:queue_duration_us:mean{w}{{{j}{sel}}} > "
                f"{factor}triton_model:compute_duration_us:mean{w}",
                "10m",
                "warning",
                f"{{{{ $labels.model }}}} on {on}: requests wait longer in the queue than they compute",
                "Mean queue time is above the mean compute time. With an idle GPU lower "
                "max_queue_delay_microseconds (see TritonQueueWhileGpuIdle); with a busy GPU add "
                "instances or hosts. `tritonfleet tune` shows the figures.",
                extra,
            )
        )
    for (ratio, low), sel, extra in _partitions(hosts, ("monitor_queue_compute_ratio", "monitor_low_utilization")):
        factor = "" if ratio == 1 else f"{number(ratio)} * "
        rules.append(
            alert(
                "TritonQueueWhileGpuIdle",
                f"(triton_model:queue_duration_us:mean{w}{{{j}{sel}}} > "
                f"{factor}triton_model:compute_duration_us:mean{w}) "
                f"and on (instance) (triton_host:gpu_utilization:avg{w} < {number(low)})",
                "10m",
                "warning",
                f"{{{{ $labels.model }}}} on {on}: queue time dominates while the GPU is under "
                f"{number(low * 100)}% busy: lower max_queue_delay_microseconds",
                "Requests wait for the dynamic batcher while the GPU idles: lower the model's "
                "max_queue_delay_microseconds (config.pbtxt, or model_overrides per GPU class).",
                extra,
            )
        )
    for (ratio,), sel, extra in _partitions(hosts, ("monitor_gpu_memory_ratio",)):
        rules.append(
            alert(
                "TritonGpuMemoryNearFull",
                f"triton_gpu:memory_used:ratio{{{j}{sel}}} > {number(ratio)}",
                "5m",
                "warning",
                f"GPU {{{{ $labels.gpu_uuid }}}} on {on} is {{{{ $value | humanizePercentage }}}} full",
                f"Used GPU memory is above {number(ratio * 100)}% of the total: a further model instance "
                "or a larger batch may fail to allocate.",
                extra,
            )
        )
    return rules


def rules_file(opts: Options, hosts: list[FleetHost], models: dict[str, list[str]]) -> dict:
    return {
        "groups": [
            {"name": f"{opts.job}.recording", "rules": recording_rules(opts)},
            {"name": f"{opts.job}.alerts", "rules": alerting_rules(opts, hosts, models)},
        ]
    }


def expected_models(hosts: list[FleetHost]) -> dict[str, list[str]]:
    """model -> hosts that serve it: the models of each host's model_repository."""
    out: dict[str, list[str]] = {}
    for h in hosts:
        repo = Path(str(h.get("model_repository")))
        if not repo.is_dir():
            raise InventoryError(
                f"{h.name}: model_repository {repo} is not a directory (set "
                "model_repository in group data, relative to where tritonfleet runs)"
            )
        for m in list_models(repo):
            out.setdefault(m, []).append(h.name)
    return out


# ---- output ----------------------------------------------------------------------------------


@dataclass
class Generated:
    files: dict[str, str]  #: path relative to DIR -> content
    targets: list[ScrapeTarget]  #: the targets of the hosts written (all, or those of ``only``)
    warnings: list[str]
    rules: dict
    job: str = "triton"
    #: --limit: the hosts whose target entries are written; every other entry is kept as it is
    only: frozenset[str] | None = None
    health_rules: dict | None = None  #: the GPU health group (tritonfleet.observability.gpu_health_rules)


def generate(hosts: list[FleetHost], opts: Options, only: set[str] | None = None) -> Generated:
    """Everything :func:`write` writes, in memory (nothing is written when this raises).
    ``hosts``: the whole inventory (the rules and the endpoint check cover every host); ``only``:
    the host names whose target entries are written (--limit), None for all."""
    opts.check()
    if not hosts:
        raise InventoryError("the inventory has no hosts")
    ts, warnings = targets(hosts)
    if only is not None:
        ts = [t for t in ts if t.host.name in only]
        warnings = [w for w in warnings if w.split(":", 1)[0] in only]
    base = opts.prometheus_dir.rstrip("/") or "."
    job = scrape_job(opts, base)
    rules = rules_file(opts, hosts, expected_models(hosts))
    files = {f"targets/{name}": json.dumps(entries, indent=2) + "\n" for name, entries in file_sd(ts, opts.job).items()}
    files[f"scrape-{opts.job}.yml"] = yaml_file(
        [job], "Scrape job for the Triton fleet: paste under scrape_configs: in prometheus.yml."
    )
    files[f"rules/{opts.job}.rules.yml"] = yaml_file(
        rules, "Recording and alerting rules for the Triton fleet (rule_files: in prometheus.yml)."
    )
    files["prometheus.yml"] = yaml_file(
        {
            "global": {"scrape_interval": opts.scrape_interval, "evaluation_interval": opts.scrape_interval},
            "rule_files": [f"{base}/rules/*.rules.yml"],
            "scrape_configs": [job],
        },
        "A complete Prometheus configuration for the Triton fleet (or merge its parts into yours).",
    )
    files[f"grafana/{opts.job}-fleet.json"] = json.dumps(dashboard.dashboard(opts), indent=2) + "\n"
    return Generated(files, ts, warnings, rules, opts.job, frozenset(only) if only is not None else None)


# ---- writing: only what this command wrote ---------------------------------------------------


class ForeignFiles(UsageError):
    """Files in the way that this command did not write (or that were changed since)."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_record(out: Path) -> dict[str, list[str]]:
    """{relative path: [sha256 of each version this command wrote]} from DIR's record."""
    path = out / RECORD
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise UsageError(
            f"{path}: unreadable ({e}): it records which files `tritonfleet prometheus` "
            "wrote; remove it and run again with --force to take the directory over"
        ) from None
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(h, str) for h in v) for k, v in files.items()
    ):
        raise UsageError(
            f"{path}: not the record `tritonfleet prometheus` writes; remove it and run again with "
            "--force to take the directory over"
        )
    return files


def _owned(out: Path, rel: str, record: dict[str, list[str]]) -> bool | None:
    """Whether DIR/rel is this command's own (None: absent): a plain file whose content is a
    version the record lists. A symlink, a directory, a file not listed or changed since is not."""
    path = out / rel
    if not path.exists() and not path.is_symlink():
        return None
    if path.is_symlink() or not path.is_file():
        return False
    try:
        return _sha256(path.read_bytes()) in record.get(rel, [])
    except OSError:
        return False


@dataclass
class ConfigPlan:
    write: dict[str, str] = field(default_factory=dict)  #: relative path -> content
    remove: list[str] = field(default_factory=list)  #: our own files no longer wanted
    replaced: list[str] = field(default_factory=list)  #: foreign files written over (--force)
    kept: list[str] = field(default_factory=list)  #: messages: foreign files left alone


def _plan_targets(
    gen: Generated,
    out: Path,
    folder: str,
    record: dict[str, list[str]],
    wanted: dict[str, str],
    p: ConfigPlan,
    force: bool,
) -> None:
    """The target files of one folder (``targets/``, ``targets/health/``) in :func:`plan`: with
    --limit the named hosts' entries merged into what is there, else this command's own files of
    groups that are gone removed (a foreign one kept, with a warning)."""
    prefix = f"{folder}/{gen.job}-"
    on_disk = (
        sorted(f"{folder}/{f.name}" for f in (out / folder).glob(f"{gen.job}-*.json"))
        if (out / folder).is_dir()
        else []
    )
    if gen.only is not None:  # --limit: the named hosts' entries change, every other one stays
        for rel in sorted(set(on_disk) | {r for r in wanted if r.startswith(prefix)}):
            if not rel.startswith(prefix):
                continue
            mine = _owned(out, rel, record)
            entries = []
            if mine:
                try:
                    entries = json.loads((out / rel).read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    entries = []
            elif mine is False:
                if rel in wanted and not force:
                    continue  # refused below
                if rel not in wanted:
                    continue  # a foreign file of no named host: not ours to touch
            kept = [e for e in entries if not (isinstance(e, dict) and (e.get("labels") or {}).get("host") in gen.only)]
            new = json.loads(wanted.get(rel, "[]"))
            merged = kept + new
            if merged:
                wanted[rel] = json.dumps(merged, indent=2) + "\n"
            else:
                wanted.pop(rel, None)
                if mine:
                    p.remove.append(rel)
    else:
        for rel in on_disk:
            if rel in wanted:
                continue
            if _owned(out, rel, record):
                p.remove.append(rel)
            else:
                p.kept.append(
                    f"{out / rel}: not written by tritonfleet prometheus (or changed since): kept, "
                    f"and Prometheus still reads it for job {gen.job} (it matches "
                    f"{prefix}*.json); remove it if its targets are gone"
                )


def plan(gen: Generated, out: Path, force: bool = False) -> ConfigPlan:
    """What :func:`write` does in DIR ``out``; raises ForeignFiles (nothing written) when a file
    it would write is not its own, unless ``force``."""
    record = read_record(out)
    p = ConfigPlan()
    wanted = dict(gen.files)
    for folder in TARGET_DIRS:
        _plan_targets(gen, out, folder, record, wanted, p, force)
    foreign = []
    for rel, content in wanted.items():
        mine = _owned(out, rel, record)
        if mine is False:
            if (out / rel).is_file() and not (out / rel).is_symlink() and (out / rel).read_bytes() == content.encode():
                p.write[rel] = content  # the very content this would write: take it over
                continue
            foreign.append(rel)
            if not force:
                continue
            if (out / rel).is_dir() and not (out / rel).is_symlink():
                raise ForeignFiles(
                    f"{out / rel} is a directory in the place of a file tritonfleet prometheus "
                    "writes: move it away (nothing was written)"
                )
            p.replaced.append(rel)
        p.write[rel] = content
    if foreign and not force:
        shown = "\n".join(f"  {out / rel}" for rel in foreign)
        raise ForeignFiles(
            f"{out} holds files tritonfleet prometheus did not write (or that were changed since it wrote "
            f"them), where it would write its own; nothing was written:\n{shown}\nPoint --out at a directory "
            "of their own, move them away, or give --force to replace them (other files are never removed)"
        )
    return p


def write(gen: Generated, out: Path, force: bool = False) -> ConfigPlan:
    """Write the files (each replaced atomically), remove this command's own target files of
    groups that are gone, and keep the record of what it wrote. Files it did not write are
    never removed, and never replaced unless ``force`` (:func:`plan`)."""
    p = plan(gen, out, force)
    record = read_record(out)
    out.mkdir(parents=True, exist_ok=True)
    # first record both versions of each file, so a crash half-way leaves every file known
    pending = {rel: sorted(set(record.get(rel, [])) | {_sha256(c.encode())}) for rel, c in p.write.items()}
    _write_record(out, {**record, **pending})
    for rel, content in p.write.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(content)
        os.replace(tmp, path)
    for rel in p.remove:
        (out / rel).unlink(missing_ok=True)
    final = {rel: hashes for rel, hashes in record.items() if rel not in p.remove and (out / rel).is_file()}
    final.update({rel: [_sha256(c.encode())] for rel, c in p.write.items()})
    _write_record(out, final)
    return p


def _write_record(out: Path, files: dict[str, list[str]]) -> None:
    doc = {
        "about": "the files `tritonfleet prometheus` wrote here, with the sha256 of their content: it "
        "replaces or removes only these, as long as they are unchanged",
        "files": dict(sorted(files.items())),
    }
    tmp = out / f".{RECORD}.tmp"
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, out / RECORD)
