"""Releases from a model origin and the image through a pull-through mirror, on the test hosts,
through real rollouts with staging: rclone's S3 gateway and nginx on the testbed's bridge, Debian's
registry as the upstream (holding the testbed's Triton image) and, set up by deploys/mirror.py on a
test host, as the mirror. Bytes are counted at each server from its own records.

Lean by design (one module, one set of servers, one mirror): the last test host runs only the
mirror; the rollouts go to the other two (one of each GPU class), the failure cases to one host.
The last rollout, from nginx with the session's own inventory and repository, is also what puts
the hosts back on the session's deployment (its release, its image), so no extra deploy runs at
the end unless that rollout failed. (The same pieces on this machine alone, with more cases:
tests/integration/model_repo/test_origin.py, test_fetch.py, tests/integration/serving/test_image_mirror.py.)"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from tests.support.testbed import (
    INVENTORY,
    api_headers,
    container_started,
    infer_resnet,
    live_release,
    pyinfra,
    repository_copy,
    ssh,
    tritonfleet,
    write_inventory,
)
from tritonfleet.model_repo import origin as origins
from tritonfleet.model_repo import render as models
from tritonfleet_testbed import hosts
from tritonfleet_testbed.origin_servers import Nginx, RcloneS3, Registry, free_port, tls_files


@pytest.fixture(scope="module")
def fleet(deployed, tmp_path_factory):
    """The servers on the bridge, the mirror set up on the last test host, an inventory that names
    them (the other two hosts in their GPU groups, the last one in image_mirror only), which asks
    its clients to log in (image_mirror_auth, the default: the client password exported here for
    the module's runs); afterwards the rolled hosts on the session's deployment, logged out of the
    mirror, and the mirror removed."""
    testbed, _, _ = deployed
    work = tmp_path_factory.mktemp("origin")
    gw = hosts.GATEWAY
    mirror_host = testbed.hosts[-1]
    rolled = [next(h for h in testbed.hosts[:-1] if h.gpu_class == c) for c in ("t4", "l4")]
    before = {h.name: (live_release(h), image_of(h)) for h in testbed.hosts}
    with pytest.MonkeyPatch.context() as env, Nginx(work / "nginx", gw) as web, RcloneS3(work / "rclone", gw) as s3, \
            Registry(work / "upstream", gw) as upstream:
        # the mirror's client password, for the mirror's deploy (its htpasswd file) and the hosts' login
        env.setenv("TRITONFLEET_MIRROR_PASSWORD", f"mirror-client-{random.randrange(1 << 30)}")
        digest = upstream.push(Path(testbed.images["triton"]), "nvidia/tritonserver:24.08-py3")
        tls = tls_files(work / "tls", mirror_host.address)
        mirror = f"{mirror_host.address}:{free_port()}"
        groups = {"t4": [rolled[0].name], "l4": [rolled[1].name], "image_mirror": [mirror_host.name]}
        inventory = write_inventory(work / "inv", groups, image_mirror=mirror,
                                    image_mirror_port=int(mirror.rsplit(":", 1)[1]),
                                    image_mirror_upstream=f"http://{upstream.host}",
                                    image_mirror_tls_cert=tls["mirror.crt"], image_mirror_tls_key=tls["mirror.key"],
                                    image_mirror_ca=tls["ca.crt"],
                                    triton_image=f"{upstream.host}/nvidia/tritonserver:24.08-py3@{digest}")
        start = upstream.mark()  # the mirror's fill and every pull through it, from here on
        res, _ = pyinfra("deploys/mirror.py", inventory=inventory, timeout=900)
        assert res.returncode == 0, res.stderr[-5000:]
        # whoever merely reaches the mirror is refused (security-review-2 finding 8)
        code = ssh(rolled[0], f"curl -s -o /dev/null -w '%{{http_code}}' --cacert /etc/docker/certs.d/{mirror}/ca.crt "
                              f"https://{mirror}/v2/nvidia/tritonserver/manifests/{digest}").strip()
        assert code == "401", code
        try:
            yield {"testbed": testbed, "rolled": rolled, "web": web, "s3": s3, "upstream": upstream,
                   "digest": digest, "mirror": mirror, "mirror_host": mirror_host, "inventory": inventory,
                   "work": work, "upstream_mark": start, "before": before,
                   # the image as the upstream stores it: its blobs (config and layers)
                   "image_size": sum(p.stat().st_size for p in upstream.storage.rglob("data"))}
        finally:
            if any((live_release(h), image_of(h)) != before[h.name] for h in rolled):
                # the last test did not put them back: the session's deployment, pushed over SSH
                res, _ = pyinfra("deploys/models.py", "--limit", ",".join(h.name for h in rolled))
                assert res.returncode == 0, res.stderr[-4000:]
            ssh(mirror_host, "systemctl stop docker-registry; DEBIAN_FRONTEND=noninteractive apt-get purge -y -q "
                             "docker-registry apache2-utils >/dev/null; rm -rf /var/lib/docker-registry /etc/docker/registry "
                             "/etc/systemd/system/docker-registry.service.d; systemctl daemon-reload", check=False)
            for h in rolled:
                ssh(h, f"docker logout {mirror} >/dev/null 2>&1; rm -rf /etc/docker/certs.d/{mirror}; "
                       f"docker rmi -f {mirror}/nvidia/tritonserver@{digest} >/dev/null 2>&1", check=False)
            for h in testbed.hosts:
                assert (live_release(h), image_of(h)) == before[h.name], h.name


def image_of(h) -> str:
    """The image the host's Triton container runs, as the unit names it."""
    return ssh(h, "docker inspect --format '{{.Config.Image}}' triton-server").strip()


def rollout(inventory: str, limit: list, repo: Path | None, *data: str) -> tuple[int, dict]:
    args = ["rollout", inventory, "deploys/models.py", "--stage", "--canary", "0", "--batch", "100%",
            "--json", "--limit", ",".join(h.name for h in limit)]
    for d in ([f"model_repository={repo}"] if repo else []) + list(data):
        args += ["--data", d]
    res = tritonfleet(*args, timeout=1200)
    try:
        return res.returncode, json.loads(res.stdout)
    except ValueError:
        raise AssertionError(res.stdout[-3000:] + res.stderr[-5000:]) from None


def marker(h, release: str) -> dict:
    """The release's manifest on the host (``release``: an id, or the live link's releases/<id>)."""
    rid = release.rstrip("/").rsplit("/", 1)[-1]
    return json.loads(ssh(h, f"cat /opt/triton/releases/{rid}/.tritonfleet-release"))["files"]


def held(h) -> set[str]:
    """The sha256 of every file of every complete release on the host (what a new release is
    hard linked from instead of fetched). Each marker is one line of JSON."""
    out = ssh(h, "for f in /opt/triton/releases/*/.tritonfleet-release; do cat \"$f\"; echo; done")
    return {v[1] for line in out.splitlines() if line.strip() for v in json.loads(line)["files"].values()}


def new_objects(h, before: set[str], new: str) -> dict[str, int]:
    """{sha: size} of the files of release ``new`` that no release on the host held before."""
    return {v[1]: int(v[0]) for p, v in marker(h, new).items() if not p.endswith("/") and v[1] not in before}


def serves_every_model(h) -> None:
    """Triton on the host has every model of the repository ready, and answers an inference."""
    import requests

    index = requests.post(f"http://{h.address}:8000/v2/repository/index", headers=api_headers(h), timeout=10).json()
    assert {m["name"] for m in index if m.get("state") == "READY"} >= {"resnet50_onnx", "text_classifier_onnx"}, index
    assert infer_resnet(h.address).shape[0] == 1


def change(repo: Path, delay: int) -> Path:
    cfg = repo / "text_classifier_onnx" / "config.pbtxt"
    text = cfg.read_text()
    cfg.write_text(text.replace("max_queue_delay_microseconds: 2000", f"max_queue_delay_microseconds: {delay}")
                   .replace("max_queue_delay_microseconds: 1500", f"max_queue_delay_microseconds: {delay}"))
    return repo


def test_rollout_from_s3_with_the_image_through_the_mirror(fleet, tmp_path, monkeypatch):
    rolled, s3, upstream = fleet["rolled"], fleet["s3"], fleet["upstream"]
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    repo = change(repository_copy(tmp_path / "repo"), random.randrange(1000, 1999))
    old = {h.name: held(h) for h in rolled}
    s3.reset()
    rc, report = rollout(fleet["inventory"], rolled, repo, f"model_origin=s3://{s3.bucket}/fleet",
                         f"model_origin_endpoint={s3.endpoint}")
    assert rc == 0 and report["ok"], json.dumps(report, indent=1)[-4000:]
    assert report["staged"]["hosts"] == sorted(h.name for h in rolled)
    for h in rolled:
        serves_every_model(h)
        assert image_of(h) == f"{fleet['mirror']}/nvidia/tritonserver:24.08-py3@{fleet['digest']}"  # pinned, mirrored
    # the origin served each host the objects it lacked, once
    want: dict[str, int] = {}
    for h in rolled:
        for s, size in new_objects(h, old[h.name], live_release(h)).items():
            want[s] = want.get(s, 0) + size
    assert want and s3.served() == want
    # the upstream registry served the image's blobs once for all the hosts: deploys/mirror.py
    # filled the mirror, the staging run's pulls came from its store
    layer = upstream.blob_bytes(fleet["upstream_mark"])
    assert fleet["image_size"] <= layer <= fleet["image_size"] + 2 * (16 << 20), (layer, fleet["image_size"])


def test_a_corrupt_object_and_a_down_origin_are_refused_before_any_restart(fleet, tmp_path, monkeypatch):
    h, s3 = fleet["rolled"][0], fleet["s3"]
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    started, live = container_started(h), live_release(h)
    repo = change(repository_copy(tmp_path / "repo"), random.randrange(3000, 3999))
    # the release as the hosts render it, uploaded, then one object damaged at the origin
    overrides = __import__("runpy").run_path("inventories/testbed.py")["_test_data"]["model_overrides"]
    rendered = models.render(repo, overrides)
    man = models.manifest(rendered)
    url = f"s3://{s3.bucket}/corrupt"
    settings = {"model_origin": url, "model_origin_endpoint": s3.endpoint, "model_origin_auth": "presigned",
                "model_origin_url_expiry": 600, "model_origin_region": None, "model_origin_upload_url": None,
                "model_origin_upload_user": None, "model_origin_upload_password_env": "X",
                "model_origin_credentials_file": "/x"}
    origin = origins.from_settings(settings)
    origins.publish(origin, rendered, man, models.release_id(man))
    path = "text_classifier_onnx/config.pbtxt"
    obj = s3.object_path("corrupt", man[path][1])
    obj.write_bytes(bytes(b ^ 1 for b in obj.read_bytes()))  # same size, other content
    try:
        rc, report = rollout(fleet["inventory"], [h], repo, f"model_origin={url}", f"model_origin_endpoint={s3.endpoint}")
    finally:
        shutil.rmtree(fleet["work"] / "rclone" / "data" / s3.bucket / "corrupt", ignore_errors=True)
    assert rc == 1 and "could not stage" in report["halted"], json.dumps(report, indent=1)[-3000:]
    [r] = report["hosts"]
    assert r["result"] == "failed" and r["batch"] is None
    assert path in r["failure"]["found"] and man[path][1] in r["failure"]["found"], r["failure"]
    assert container_started(h) == started and live_release(h) == live

    # an origin that does not answer: the plan stops before the host is touched
    rc, report = rollout(fleet["inventory"], [h], repo, f"model_origin=http://{hosts.GATEWAY}:{free_port(hosts.GATEWAY)}/m")
    assert rc == 1 and "planning failed" in report["halted"] and "model origin" in report["halted"], report["halted"]
    assert container_started(h) == started and live_release(h) == live


def test_rollout_from_http_origin_back_to_the_session_release(fleet):
    """From nginx, with the session's own inventory and repository: the hosts fetch the session's
    release (its cached copies removed first, so that there is something to fetch) and run the
    session's image again, which is also how this module leaves them. After the S3 rollout (the
    hosts then serve another release)."""
    rolled, web = fleet["rolled"], fleet["web"]
    session = {h.name: fleet["before"][h.name][0] for h in rolled}
    for h in rolled:
        assert live_release(h) != session[h.name], "runs after test_rollout_from_s3_with_the_image_through_the_mirror"
        cfg = marker(h, session[h.name])["text_classifier_onnx/config.pbtxt"][1]
        # every cached release holding that file goes: the host must fetch it
        ssh(h, "for m in /opt/triton/releases/*/.tritonfleet-release; do d=${m%/.tritonfleet-release}; "
               f"[ \"$(readlink -f /opt/triton/model_repository)\" = \"$d\" ] || ! grep -q {cfg} \"$m\" || rm -rf \"$d\"; done")
    old = {h.name: held(h) for h in rolled}
    mark = web.mark()
    rc, report = rollout(INVENTORY, rolled, None, f"model_origin={web.url}")
    assert rc == 0 and report["ok"], json.dumps(report, indent=1)[-4000:]
    want: dict[str, int] = {}
    for h in rolled:
        serves_every_model(h)
        assert live_release(h) == session[h.name]
        for s, size in new_objects(h, old[h.name], live_release(h)).items():
            want[s] = want.get(s, 0) + size
    assert want and web.served(mark) == want
