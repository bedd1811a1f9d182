"""The image through the mirror at deploy time: the Triton image pulled from the mirror by digest
(no login on the host), the mirror host's registry in proxy mode (tritonfleet.steps.mirror), and
pre-flight refusing an image through the mirror that is not pinned by digest."""

from __future__ import annotations

import re

import pytest

DIGEST = "sha256:" + "c" * 64


def test_the_image_is_pulled_through_the_mirror_by_digest_without_a_login(monkeypatch):
    from tests.support.fakehost import run_fake
    from tritonfleet.steps.triton import triton_image

    monkeypatch.setenv("TRITONFLEET_REGISTRY_PASSWORD", "s3cr3t")
    data = {"image_mirror": "mirror.local:5000", "registry_user": "$oauthtoken",
            "triton_image": f"nvcr.io/nvidia/tritonserver:24.08-py3@{DIGEST}"}
    _, cmds, state = run_fake(triton_image, {}, data)
    assert not state.failed_hosts
    run = "\n".join(cmds)
    assert f"docker pull mirror.local:5000/nvidia/tritonserver:24.08-py3@{DIGEST}" in run
    assert "docker login" not in run and "nvcr.io" not in run  # the mirror logs in upstream, not the host


def test_the_mirror_host_gets_debians_registry_as_a_proxy_of_the_upstream(monkeypatch, tmp_path):
    from tests.support.fakehost import run_fake
    from tritonfleet.steps.mirror import CONFIG, DROP_IN, image_mirror

    monkeypatch.setenv("TRITONFLEET_REGISTRY_PASSWORD", "s3cr3t")
    for name in ("ca.crt", "m.crt", "m.key"):
        (tmp_path / name).write_text(f"-----{name}-----\n")
    data = {"image_mirror": "mirror.local:5000", "registry_user": "$oauthtoken",
            "image_mirror_tls_cert": str(tmp_path / "m.crt"), "image_mirror_tls_key": str(tmp_path / "m.key"),
            "image_mirror_ca": str(tmp_path / "ca.crt")}
    # the mirror group is t4 here (fakehost reads group data only for the GPU classes)
    host, cmds, state = run_fake(image_mirror, {}, {**data, "image_mirror_group": "t4"})
    assert not state.failed_hosts
    run = "\n".join(cmds)
    assert "docker-registry" in run and re.search(r"systemctl (re)?start docker-registry", run), run[-3000:]
    config = __import__("json").loads(host.connector.uploads[CONFIG])
    assert config["proxy"] == {"remoteurl": "https://nvcr.io", "username": "$oauthtoken", "password": "s3cr3t"}
    assert config["http"]["tls"] == {"certificate": "/etc/docker/registry/mirror.crt",
                                     "key": "/etc/docker/registry/mirror.key"}
    assert "Restart=on-failure" in host.connector.uploads[DROP_IN]
    # a host outside the mirror group gets nothing of it
    _, cmds, _ = run_fake(image_mirror, {}, data)
    assert not any("docker-registry" in c for c in cmds)


def test_an_unpinned_image_through_the_mirror_is_refused_by_preflight():
    from pyinfra.api import Config, Inventory, State
    from pyinfra.context import ctx_host, ctx_state

    from tritonfleet import preflight
    from tritonfleet.settings.defaults import DEFAULTS

    data = {**DEFAULTS, "image_mirror": "mirror.local:5000"}
    inventory = Inventory(([("@fake/h1", data)], {}))
    h = inventory.get_host("@fake/h1")
    with ctx_state.use(State(inventory, Config())), ctx_host.use(h):
        with pytest.raises(preflight.PreflightError, match=r"not pinned by digest.*nvcr.io/nvidia/tritonserver:24.08-py3@sha256"):
            preflight.check_image_mirror()
        h.data.triton_image = f"nvcr.io/nvidia/tritonserver:24.08-py3@{DIGEST}"
        preflight.check_image_mirror()  # pinned: passes


