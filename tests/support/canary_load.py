"""What the traffic-canary tests and benchmark share: a client loop of known size through HAProxy,
a real Prometheus scraping the test hosts and the rollout's state metrics, an independent 1 Hz
reader of HAProxy's stats, and the model releases (a regression: a model that fails on token ids
its vocabulary lacks; more latency: a longer batching delay)."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
MODEL = "text_classifier_onnx"
SEQ = 128
GOOD_IDS = [1] * SEQ
POISON_IDS = [1] * (SEQ - 1) + [5000]  # a token id beyond 1024: hashed by the released model, not by the regression


def body(ids: list[int]) -> dict:
    return {"inputs": [{"name": "input_ids", "shape": [1, SEQ], "datatype": "INT64", "data": ids},
                       {"name": "attention_mask", "shape": [1, SEQ], "datatype": "INT64", "data": [1] * SEQ}]}


class Client:
    """Sends ``total`` inferences of MODEL through ``url`` (at most ``rate`` a second when given,
    ``threads`` at once, each thread with its own keep-alive connection), a ``poison`` share of
    them (drawn at random, seeded: a fixed period would line up with HAProxy's round robin and
    miss some servers) with an id the regression cannot take. Stops at ``total``, at
    ``max_seconds`` or when stopped. Counts answers by the server HAProxy names (X-Server) and
    failures."""

    def __init__(self, url: str, total: int, *, rate: float | None = None, threads: int = 8,
                 poison: float = 0.0, max_seconds: float = 600, seed: int = 31):
        self.url = f"{url}/v2/models/{MODEL}/infer"
        self.total, self.rate, self.threads = total, rate, threads
        self.max_seconds = max_seconds
        rng = random.Random(seed)
        self._poisoned = [rng.random() < poison for _ in range(min(total, 10 ** 6))] if poison else []
        self.poisoned = 0
        self.by_server: Counter = Counter()
        self.failed_by_server: Counter = Counter()
        self.failures: list[str] = []
        self.sent = 0
        self.seconds = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._local = threading.local()

    def _session(self) -> requests.Session:
        s = getattr(self._local, "s", None)
        if s is None:
            s = self._local.s = requests.Session()
            s.trust_env = False
        return s

    def _one(self, i: int) -> None:
        bad_ids = bool(self._poisoned) and self._poisoned[i % len(self._poisoned)]
        ids = POISON_IDS if bad_ids else GOOD_IDS
        server, bad = "?", ""
        try:
            r = self._session().post(self.url, json=body(ids), timeout=30)
            server = r.headers.get("X-Server", "?")
            if r.status_code != 200:
                bad = f"HTTP {r.status_code} {r.text[:100]}"
        except requests.RequestException as e:
            bad = f"{type(e).__name__}: {str(e)[:100]}"
        with self._lock:
            self.by_server[server] += 1
            self.poisoned += bad_ids
            if bad:
                self.failed_by_server[server] += 1
                self.failures.append(f"{server}: {bad}")

    def _run(self) -> None:
        t0 = time.monotonic()
        with ThreadPoolExecutor(self.threads) as pool:
            sem = threading.Semaphore(self.threads * 2)
            for i in range(self.total):
                if self._stop.is_set() or time.monotonic() - t0 > self.max_seconds:
                    break
                sem.acquire()
                fut = pool.submit(self._one, i)
                fut.add_done_callback(lambda _f: sem.release())
                self.sent += 1
                if self.rate:
                    time.sleep(max(0.0, t0 + (i + 1) / self.rate - time.monotonic()))
        self.seconds = time.monotonic() - t0

    def start(self) -> Client:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def done(self) -> int:
        return sum(self.by_server.values())


class StatReader:
    """Reads HAProxy's `show stat` every ``interval`` s on its own (not tritonfleet's code): how
    many servers of the backend HAProxy does not send requests to (status not UP / no check, or
    weight 0: drained and maintenance servers have effective weight 0)."""

    def __init__(self, command, backend: str = "triton", interval: float = 1.0):
        self.command, self.backend, self.interval = command, backend, interval
        self.samples: list[tuple[float, int, list[str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            lines = [ln for ln in self.command("show stat").splitlines() if ln.strip()]
            head = lines[0][2:].split(",")
            out = []
            for ln in lines[1:]:
                row = dict(zip(head, ln.split(","), strict=False))
                if row["pxname"] != self.backend or row["svname"] in ("FRONTEND", "BACKEND"):
                    continue
                up = row["status"].startswith("UP") or row["status"] == "no check"
                if not up or int(row["weight"] or 0) == 0:
                    out.append(row["svname"])
            self.samples.append((time.time(), len(out), out))
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - t)))

    def __enter__(self) -> StatReader:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def most_out(self) -> int:
        return max((n for _, n, _ in self.samples), default=0)


class Prometheus:
    """Debian's Prometheus on loopback scraping the inventory's hosts (the files `tritonfleet
    prometheus` writes, 1 s scrapes) and a rollout's state endpoint; stopped by its process id."""

    def __init__(self, work: Path, inventory: str, rollout_port: int, env: dict):
        from tritonfleet_testbed.ports import free_port

        cfg = work / "cfg"
        res = subprocess.run([str(Path(env["PATH"].split(":")[0]) / "tritonfleet"), "prometheus", inventory,
                              "--out", str(cfg), "--scrape-interval", "1s", "--rate-window", "10s"],
                             cwd=ROOT, capture_output=True, text=True, env=env)
        assert res.returncode == 0, res.stderr
        conf = yaml.safe_load((cfg / "prometheus.yml").read_text())
        conf["rule_files"] = []
        conf["scrape_configs"].append({"job_name": "tritonfleet-rollout", "scrape_interval": "1s",
                                       "static_configs": [{"targets": [f"127.0.0.1:{rollout_port}"]}]})
        (cfg / "prometheus.yml").write_text(yaml.safe_dump(conf))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = work / "prometheus.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={cfg / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.http = requests.Session()
        self.http.trust_env = False
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, self.log_path.read_text()[-3000:]
            try:
                if self.http.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, "prometheus did not get ready"
            time.sleep(0.3)

    def query(self, expr: str) -> list[dict]:
        body = self.http.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10).json()
        assert body["status"] == "success", body
        return body["data"]["result"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        self.http.close()


def regression_repository(dest: Path) -> Path:
    """files/model_repository with the text classifier's token hashing removed: ids beyond its
    1024-row embedding table make ONNX Runtime fail the request (a model released with a smaller
    vocabulary than the traffic uses)."""
    import onnx

    shutil.copytree(ROOT / "files" / "model_repository", dest)
    path = dest / MODEL / "1" / "model.onnx"
    model = onnx.load(str(path))
    graph = model.graph
    [hash_node] = [n for n in graph.node if n.op_type == "Mod"]
    graph.node.remove(hash_node)
    for n in graph.node:
        n.input[:] = ["input_ids" if i == "bucket" else i for i in n.input]
    [buckets] = [i for i in graph.initializer if i.name == "vocab_buckets"]
    graph.initializer.remove(buckets)
    onnx.checker.check_model(model, full_check=True)
    path.write_bytes(model.SerializeToString(deterministic=True))
    return dest


def slower_overrides(base: dict, delay_us: int) -> dict:
    """The inventory's model_overrides with the text classifier's dynamic batcher waiting
    ``delay_us`` for a fuller batch (every lone request waits that long)."""
    out = json.loads(json.dumps(base))
    out.setdefault(MODEL, {})["dynamic_batching"] = {"preferred_batch_size": [4, 8, 16, 32],
                                                     "max_queue_delay_microseconds": delay_us}
    return out


def wait_for_state(directory: Path, host: str, state: str, timeout: float, proc=None) -> dict:
    """The rollout's state file once ``host`` is in ``state`` (the newest rollout under ``directory``)."""
    deadline = time.monotonic() + timeout
    while True:
        for f in sorted(directory.glob("*/state.json"), key=lambda p: p.stat().st_mtime, reverse=True):
            try:
                data = json.loads(f.read_text())
            except ValueError:
                continue
            if data["hosts"].get(host, {}).get("state") == state:
                return data
            break
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the rollout ended before {host} was {state}: {proc.stdout.read()[-3000:]}")
        assert time.monotonic() < deadline, f"{host} not {state} after {timeout}s"
        time.sleep(0.2)
