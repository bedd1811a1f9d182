"""The traffic canary's and the capacity rules' goal figures, many runs on the testbed
(`bench/run.py canary`; docs/fleet-operations.md).

Debian's HAProxy on loopback in front of the three deployed hosts, Debian's Prometheus scraping
them every second, a client sending inferences through HAProxy at a steady rate (the same client
as tests/testbed/test_canary.py), and `tritonfleet rollout --canary-weight P` with the canary
analysis reading that Prometheus:

* errors (``--errors N``): a release whose text classifier fails on token ids beyond its
  vocabulary, 2% of the client's requests carrying one; rolled back within the analysis window
  plus 30 s, from the moment the analysis starts to the canary serving the old release again;
* latency (``--latency N``): a release whose dynamic batcher waits longer, calibrated to +50% of
  the mean request time measured on the hosts under the same load before the runs; same bound;
* identical (``--identical M``): a release that serves the same (a new release id: a model
  parameter no backend reads toggled, so the canary loads it as any release), promoted: false
  rollbacks counted;
* capacity (``--capacity``): a rollout restarting every host with rollout_max_unavailable 25%
  over a backend of four servers (the hosts and a local tritonserver), HAProxy's stats read every
  second by the client side: never more than one server out.

The hosts run in ``--canary-mode`` (default explicit: a model release and its rollback load through
Triton's repository API without a restart, the way docs/fleet-operations.md recommends model
updates; ``none`` restarts Triton for each) and are deployed back to the inventory's settings at
the end.

Every run's figures go to bench/results/canary-<time>.json; the table to the run's .md.
"""

from __future__ import annotations

import json
import runpy
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support: the helpers the testbed tests use

INVENTORY = "inventories/testbed.py"


def _env(log_dir: Path) -> dict:
    from tests.support.testbed import env

    return dict(env(), TRITONFLEET_LOG_DIR=str(log_dir))


def _rollout(log_dir: Path, args: list[str], timeout: float = 900) -> tuple[int, dict, str]:
    from tests.support.testbed import TRITONFLEET

    res = subprocess.run([TRITONFLEET, "rollout", INVENTORY, "deploys/models.py", *args, "--json"], cwd=ROOT,
                         capture_output=True, text=True, env=_env(log_dir), timeout=timeout)
    try:
        return res.returncode, json.loads(res.stdout), res.stderr
    except ValueError:
        return res.returncode, {}, res.stdout + res.stderr


def _data(**kv) -> list[str]:
    return [a for k, v in kv.items() for a in ("--data", f"{k}={v if isinstance(v, str) else json.dumps(v)}")]


def _deploy(data: list[str], deploy: str = "deploys/triton.py", limit: list[str] | None = None) -> None:
    from tests.support.testbed import PYINFRA

    lim = [a for n in limit or [] for a in ("--limit", n)]
    res = subprocess.run([PYINFRA, "-y", *lim, *data, INVENTORY, deploy], cwd=ROOT, capture_output=True,
                         text=True, timeout=3600)
    if res.returncode != 0:
        raise SystemExit(f"[bench] deploy failed:\n{res.stderr[-4000:]}")


def _calibrate(hap, prom, hosts, base_overrides: dict, mode: list[str], rate: float, step: float, base_ms: float,
               log, meta: dict) -> int:
    """The batching delay whose release makes a host +50% slower, measured the way the analysis
    measures it (the median of per-step mean request times, against a host of the old release at
    the same weight, under the runs' load): the delay's effect on the request time depends on the
    load (dynamic batching), so it is measured rather than assumed. Up to four tries; the host
    goes back to the inventory's release after."""
    from tests.support.canary_load import Client, slower_overrides
    from tritonfleet.fleet.rollout import canary as cn
    from tritonfleet.serving.haproxy_weights import Weights

    order = [h.name for h in hosts if h.gpu_class == "t4"] + [h.name for h in hosts if h.gpu_class != "t4"]
    canary, matched, other = order[0], order[1], order[2]  # the rollout's canary and matched host
    w = Weights([hap.socket], "triton")
    original = w.current()
    extra_us = base_ms * 1000 * 0.5
    tries = []
    try:
        for _ in range(4):
            delay = 2000 + int(extra_us)
            _deploy(mode + _data(model_overrides=slower_overrides(base_overrides, delay)), "deploys/models.py",
                    [canary])
            w.set({canary: 1, matched: 1, other: 2})  # the runs' 25% each
            t0 = time.time()
            Client(hap.url, 10 ** 6, rate=rate, threads=8, max_seconds=45).start().join()
            fig = cn.collect(cn.Prometheus(prom.url), cn.Settings(prom.url, step_seconds=step), [canary],
                             [matched, other], t0 + 5, time.time() - 2, matched=[matched])
            rise = fig.latency_rise if fig.latency_rise is not None else 0.0
            tries.append({"delay_us": delay, "rise": rise})
            log(f"calibration: batching delay {delay} us makes {canary} {rise * 100:+.0f}% against {matched}")
            if 0.45 <= rise <= 0.75:
                break
            extra_us *= min(4.0, max(0.25, 0.55 / max(rise, 0.05)))
    finally:
        w.restore(original)
        _deploy(mode, "deploys/models.py", [canary])
    meta["calibration"] = tries
    return tries[-1]["delay_us"]


def _mean_latency_ms(prom, hosts: list[str], seconds: int) -> float:
    sel = f'{{job="triton", model="text_classifier_onnx", host=~"{"|".join(hosts)}"}}'
    r = prom.query(f"sum(increase(nv_inference_request_duration_us{sel}[{seconds}s])) / "
                   f"sum(increase(nv_inference_request_success{sel}[{seconds}s]))")
    return float(r[0]["value"][1]) / 1000 if r else float("nan")


def run(results, args, log) -> None:
    """Adds the rows to ``results`` (bench/run.py's Results); the per-run figures to its meta."""
    from tests.support.canary_load import (
        Client,
        Prometheus,
        StatReader,
        regression_repository,
        slower_overrides,
    )
    from tests.support.haproxy import HAProxy
    from tests.support.tritonproc import copy_repository, free_port, local_server
    from tritonfleet.serving.drain import HAProxy as Runtime

    sys.path.insert(0, str(ROOT / "bench"))
    from run import WORK, Row, deploy, ensure_testbed

    hosts = ensure_testbed(3)
    mode = _data(triton_model_control_mode=args.canary_mode)
    log(f"deploy (converge the testbed, model-control mode {args.canary_mode})")
    _deploy(mode)
    names = [h.name for h in hosts]
    work = WORK / f"canary-{time.strftime('%Y%m%d-%H%M%S')}"
    work.mkdir(parents=True)
    port = free_port()
    window, rate = args.canary_window, args.canary_rate
    runs: list[dict] = []
    results.meta["canary"] = {"window_s": window, "rate": rate, "weight": args.canary_weight, "runs": runs}
    # the inventory's own model_overrides (read from its file: loading it through pyinfra's command
    # line would install gevent in this process, under the client's threads)
    base_overrides = runpy.run_path(str(ROOT / INVENTORY))["_test_data"]["model_overrides"]
    (work / "prom").mkdir()
    prom = Prometheus(work / "prom", INVENTORY, port, _env(work))
    (work / "hap").mkdir()
    try:
        with HAProxy(work / "hap", [(h.name, f"{h.address}:8000") for h in hosts],
                     extra=["http-response set-header X-Server %[srv_name]"]) as hap:
            for n in names:
                Runtime([hap.socket], "triton", n).wait_serving(60)
            common = mode + _data(lb="haproxy", lb_haproxy_sockets=[hap.socket], canary_prometheus_url=prom.url,
                                  rollout_metrics_listen=f"127.0.0.1:{port}", canary_analysis_seconds=window,
                                  canary_step_seconds=args.canary_step, canary_max_extensions=2)
            # the hosts' mean request time under the runs' load, for the +50% release
            load = Client(hap.url, 10 ** 6, rate=rate, threads=8, max_seconds=45).start()
            load.join()
            base_ms = _mean_latency_ms(prom, names, 30)
            delay_us = 2000 + int(base_ms * 1000 * 0.5)
            if args.latency:
                delay_us = _calibrate(hap, prom, hosts, base_overrides, mode, rate, args.canary_step, base_ms, log,
                                      results.meta["canary"])
            log(f"mean request time under {rate}/s: {base_ms:.2f} ms; the slower release waits {delay_us} us "
                "(2000 us before)")
            results.meta["canary"].update(base_ms=base_ms, slow_delay_us=delay_us)
            bad = regression_repository(work / "regression")
            kinds = ["errors"] * args.errors + ["latency"] * args.latency + ["identical"] * args.identical
            toggle = 0
            for i, kind in enumerate(kinds, 1):
                extra = ["--canary-weight", str(args.canary_weight), "--batch", "2"]
                poison = 0.0
                if kind == "errors":
                    extra += _data(model_repository=str(bad))
                    poison = 0.02  # 2% of the requests
                elif kind == "latency":
                    extra += _data(model_overrides=slower_overrides(base_overrides, delay_us))
                else:  # the same model, a new release: a parameter no backend reads, toggled
                    toggle += 1
                    same = json.loads(json.dumps(base_overrides))
                    same.setdefault("text_classifier_onnx", {})["parameters"] = {
                        "release_tag": {"string_value": f"r{toggle % 2}"}}
                    extra += _data(model_overrides=same)
                client = Client(hap.url, 10 ** 6, rate=rate, threads=8, poison=poison,
                                max_seconds=window * 4 + 600).start()
                t0 = time.monotonic()
                rc, report, err = _rollout(work / "rollouts", extra + common)
                client.stop()
                cn = report.get("canary") or {}
                rec = {"run": i, "kind": kind, "rc": rc, "seconds": round(time.monotonic() - t0, 1),
                       "verdict": cn.get("verdict"), "why": (cn.get("why") or "")[:300],
                       "results": [h["result"] for h in report.get("hosts", [])],
                       "looks": [{"canary": lk["canary"]["requests"], "baseline": lk["baseline"]["requests"],
                                  "errors_c": lk["canary"]["error_ratio"], "errors_b": lk["baseline"]["error_ratio"],
                                  "error_p": lk["error_p"], "rise": lk["latency_rise"], "latency_p": lk["latency_p"]}
                                 for lk in cn.get("looks", [])],
                       "client": {"sent": client.done, "failed": len(client.failures)}}
                if cn.get("analysis_start"):
                    rec["decided_s"] = round(cn["decided"] - cn["analysis_start"], 1)
                    if cn.get("rolled_back"):
                        rec["rolled_back_s"] = round(cn["rolled_back"] - cn["analysis_start"], 1)
                    if cn.get("out_of_traffic"):
                        rec["out_of_traffic_s"] = round(cn["out_of_traffic"] - cn["analysis_start"], 1)
                if not report:
                    rec["error"] = err[-2000:]
                runs.append(rec)
                log(f"run {i}/{len(kinds)} {kind}: {rec['verdict']} ({rec.get('decided_s')} s to decide, "
                    f"{rec.get('rolled_back_s', '-')} s to rolled back) {rec['looks']}")
                if kind == "identical" and rec["verdict"] != "promote":
                    log("a false rollback: converging the fleet again")
                    _deploy(mode)
            if args.capacity:
                _capacity(results, work, hosts, hap, prom, port, log, local_server, copy_repository,
                          StatReader, Runtime, mode)
    finally:
        prom.stop()
        log("deploy (the testbed back to its inventory's settings)")
        deploy()
    bound = window + 30
    for kind, goal in (("errors", "rolled back within the window + 30 s"),
                       ("latency", "rolled back within the window + 30 s")):
        done = [r for r in runs if r["kind"] == kind]
        if not done:
            continue
        ok = [r for r in done if r["verdict"] == "roll back" and r.get("rolled_back_s", 1e9) <= bound]
        times = [r["rolled_back_s"] for r in done if "rolled_back_s" in r]
        results.add(Row(f"canary {kind} (2% errors)" if kind == "errors" else "canary latency (+50%)",
                        times, target=f"{len(done)}/{len(done)} {goal} ({bound:g} s)",
                        met=len(ok) == len(done),
                        note=f"{len(ok)}/{len(done)} rolled back in time; decided after "
                             f"{statistics.median([r['decided_s'] for r in done if 'decided_s' in r]):.1f} s (median)"))
    done = [r for r in runs if r["kind"] == "identical"]
    if done:
        false = [r for r in done if r["verdict"] != "promote"]
        results.add(Row("canary identical release", [r["decided_s"] for r in done if "decided_s" in r],
                        target=f"0 false rollbacks in {len(done)}", met=not false,
                        note=f"{len(done) - len(false)}/{len(done)} promoted"))


def _capacity(results, work, hosts, hap_main, prom, port, log, local_server, copy_repository, StatReader,
              Runtime, mode: list[str]) -> None:
    """A rollout that restarts every host (its unit changed and then changed back) with
    rollout_max_unavailable 25% over four servers, HAProxy's stats read every second."""
    from tests.support.haproxy import HAProxy

    sys.path.insert(0, str(ROOT / "bench"))
    from run import Row

    repo = copy_repository(work / "local-repo", kind_cpu=True)
    (work / "hap4").mkdir()
    with local_server(repo, work) as local, \
            HAProxy(work / "hap4", [(h.name, f"{h.address}:8000") for h in hosts] + [("local", local.url)]) as hap:
        for n in [h.name for h in hosts] + ["local"]:
            Runtime([hap.socket], "triton", n).wait_serving(60)
        common = mode + _data(lb="haproxy", lb_haproxy_sockets=[hap.socket], rollout_max_unavailable="25%",
                              rollout_metrics_listen=f"127.0.0.1:{port}")
        most, samples, secs = [], 0, []
        for stop in (29, 30):
            with StatReader(hap.command) as stats:
                t0 = time.monotonic()
                rc, report, err = _rollout(work / "rollouts-capacity", ["--batch", "1", *common,
                                                                        *_data(triton_stop_timeout=stop)])
                secs.append(time.monotonic() - t0)
            if rc != 0:
                raise SystemExit(f"[bench] capacity rollout failed: {report.get('halted')} {err[-2000:]}")
            most.append(stats.most_out)
            samples += len(stats.samples)
            log(f"capacity rollout (stop timeout {stop}): at most {stats.most_out} of 4 servers out in "
                f"{len(stats.samples)} readings, {secs[-1]:.0f} s")
    results.meta.setdefault("canary", {})["capacity"] = {"most_out": most, "samples": samples, "seconds": secs}
    results.add(Row("max_unavailable 25% of 4 servers: most out in a 1 Hz reading", [float(max(most))], unit="",
                    target="<= 1 (a quarter)", met=max(most) <= 1,
                    note=f"{samples} readings over 2 rollouts restarting every host ({sum(secs):.0f} s)"))


# ---- the picture ---------------------------------------------------------------------------------

def plot(runs: list[dict], out: Path, window: float, max_rise: float = 0.2, max_error: float = 0.005) -> None:
    """docs/canary.png from the runs' figures (bench/canary-results.json): when each regression
    served the old release again against the goal's bound, and what the analysis measured on the
    canary (latency rise, error ratio) against the thresholds (canary_max_latency_rise,
    canary_max_error_increase at their defaults), for every kind of run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"errors": "#d62728", "latency": "#ff7f0e", "identical": "#7f7f7f"}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    ax = axes[0]
    for kind in ("errors", "latency"):
        ys = [r["rolled_back_s"] for r in runs if r["kind"] == kind and r.get("rolled_back_s") is not None]
        ax.plot(range(1, len(ys) + 1), ys, "o", color=colours[kind], label=f"{kind} ({len(ys)} runs)")
    ax.axhline(window, color="#1f77b4", ls=":", label=f"analysis window ({window:g} s)")
    ax.axhline(window + 30, color="black", ls="--", label=f"goal: window + 30 s ({window + 30:g} s)")
    ax.set(title="analysis start to the old release served again", xlabel="run", ylabel="seconds", ylim=(0, window + 45))
    ax.legend(fontsize=7, loc="lower right")
    for ax, key, limit, label, scale in ((axes[1], "rise", max_rise, "latency rise on the canary (%)", 100),
                                          (axes[2], "errors_c", max_error, "canary error ratio (%, baseline 0)", 100)):
        for i, kind in enumerate(("identical", "latency", "errors")):
            ys = [(r["looks"][-1].get(key) or 0) * scale for r in runs if r["kind"] == kind and r.get("looks")]
            xs = [i + (j - len(ys) / 2) * 0.012 for j in range(len(ys))]
            promoted = sum(r["verdict"] == "promote" for r in runs if r["kind"] == kind)
            ax.plot(xs, ys, "o", color=colours[kind], alpha=0.7,
                    label=f"{kind}: {promoted}/{len(ys)} promoted" if ys else None)
        ax.axhline(limit * scale, color="black", ls="--", label=f"threshold ({limit * scale:g}%)")
        ax.set_xticks(range(3), ["identical", "+50% latency", "2% errors"])
        ax.set(title=label, ylabel="%")
        ax.legend(fontsize=7)
    fig.suptitle("Traffic canary on the test hosts (bench/run.py canary: weight 25%, 60 requests/s)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


if __name__ == "__main__":  # python bench/canary.py plot [RESULTS.json] [OUT.png]
    if sys.argv[1:2] != ["plot"]:
        raise SystemExit("usage: python bench/canary.py plot [bench/canary-results.json] [docs/canary.png]")
    src = Path(sys.argv[2] if len(sys.argv) > 2 else ROOT / "bench" / "canary-results.json")
    dst = Path(sys.argv[3] if len(sys.argv) > 3 else ROOT / "docs" / "canary.png")
    saved = json.loads(src.read_text())["runs"]
    plot([r for s in saved for r in s["meta"]["canary"]["runs"]], dst, saved[-1]["meta"]["canary"]["window_s"])
    print(dst)
