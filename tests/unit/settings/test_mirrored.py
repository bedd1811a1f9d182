"""Image references as the hosts pull them through image_mirror (tritonfleet.settings.mirrored):
read as Docker reads them, rewritten to the mirror only for the mirror's upstream registry, the
same in the deploy's accessor and in the fleet commands' inventory."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tritonfleet.inventory.roster import FleetHost
from tritonfleet.serving.images import registry_of, split_image
from tritonfleet.settings import access, mirrored

NAMES = st.sampled_from(["nvcr.io/nvidia/tritonserver", "nvidia/cuda", "ubuntu", "localhost/a",
                         "10.77.4.1:5000/nvidia/tritonserver", "registry.example:443/a/b/c"])


@given(NAMES, st.one_of(st.none(), st.sampled_from(["24.08-py3", "1", "latest"])),
       st.one_of(st.none(), st.just("sha256:" + "ab" * 32)))
def test_references_are_read_as_docker_reads_them(name, tag, digest):
    image = f"{name}{f':{tag}' if tag else ''}{f'@{digest}' if digest else ''}"
    registry, path, t, d = mirrored.parse_reference(image)
    n, t2, d2 = split_image(image)
    assert (registry, t, d) == (registry_of(image), t2, d2)  # the same rules as ops.registry
    assert n.endswith(path.removeprefix("library/"))
    out = mirrored.rewrite(image, "mirror.local:5000", "https://nvcr.io")
    if registry == "nvcr.io":
        assert out == f"mirror.local:5000/{path}{f':{tag}' if tag else ''}{f'@{digest}' if digest else ''}"
        assert mirrored.unpinned(image, "mirror.local:5000", "https://nvcr.io") == (digest is None)
    else:
        assert out == image  # Docker Hub and other registries: not through this mirror
    assert mirrored.rewrite(image, None, "https://nvcr.io") == image




DIGEST = "sha256:" + "cd" * 32


@given(st.sampled_from([None, "mirror.local:5000"]),
       st.sampled_from([None, "nvcr.io/nvidia/tritonserver:24.08-py3", f"nvcr.io/nvidia/tritonserver@{DIGEST}",
                        "nvidia/cuda:12.4.1-base-ubuntu22.04"]),
       st.sampled_from(["https://nvcr.io", "http://10.0.0.9:5000"]))
def test_the_deploy_and_the_fleet_commands_read_the_same_image(mirror, image, upstream):
    """The current host's accessor (access.get: the deploy) and the inventory's data
    (mirrored.apply: FleetHost, the fleet commands) name the same image, so status and history
    compare what the unit runs."""
    data = {"image_mirror": mirror, "image_mirror_upstream": upstream, "triton_image": image,
            "cuda_test_image": image, "triton_http_port": 8000}

    class Host:  # pyinfra's current host, as access.get reads it
        name = "h1"

    Host.data = data
    original = access.host
    access.host = Host()
    try:
        deploy = {k: access.current().get(k) for k in (*mirrored.MIRRORED, "triton_http_port")}
    finally:
        access.host = original
    fleet = FleetHost("h1", ["t4"], mirrored.apply(dict(data)))
    assert deploy == {k: fleet.get(k) for k in deploy}
    through = image and mirror and registry_of(image) == mirrored.registry_host(upstream)
    assert deploy["triton_image"] == (f"{mirror}/{image.split('/', 1)[1]}" if through else image)
    assert deploy["triton_http_port"] == 8000 and data["triton_image"] == image  # nothing else, no copy changed
