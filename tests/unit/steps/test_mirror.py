"""The image through the mirror at deploy time: the Triton image pulled from the mirror by digest
(the host logs in to the mirror with its client credential, never to the upstream), the mirror
host's registry in proxy mode asking its clients to log in (tritonfleet.steps.mirror), and
pre-flight refusing an image through the mirror that is not pinned by digest or whose login has
no secret."""

from __future__ import annotations

import re

import pytest

DIGEST = "sha256:" + "c" * 64


CLIENT_SECRET = "mirror-cl1ent-S3CRET"


def test_the_image_is_pulled_through_the_mirror_by_digest_logged_in_to_the_mirror_only(monkeypatch, caplog, capfd):
    """security-review-2 finding 8: the host logs in to the mirror (its client credential, the
    secret on stdin, in no byte of the run's output or commands) before it pulls through it; never
    to the upstream (the mirror does that itself). With image_mirror_auth off: no login at all."""
    import logging

    from tests.support.fakehost import run_fake
    from tritonfleet.steps.triton import triton_image

    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("TRITONFLEET_REGISTRY_PASSWORD", "s3cr3t")
    monkeypatch.setenv("TRITONFLEET_MIRROR_PASSWORD", CLIENT_SECRET)
    data = {"image_mirror": "mirror.local:5000", "registry_user": "$oauthtoken",
            "triton_image": f"nvcr.io/nvidia/tritonserver:24.08-py3@{DIGEST}"}
    _, cmds, state = run_fake(triton_image, {}, data)
    assert not state.failed_hosts
    run = "\n".join(cmds)
    login = "docker login --username tritonfleet --password-stdin mirror.local:5000"
    pull = f"docker pull mirror.local:5000/nvidia/tritonserver:24.08-py3@{DIGEST}"
    assert login in run and pull in run and run.index(login) < run.index(pull)
    assert run.count("docker login") == 1 and "nvcr.io" not in run  # the mirror logs in upstream, not the host
    out = capfd.readouterr()
    assert CLIENT_SECRET not in run + caplog.text + out.out + out.err and "s3cr3t" not in run
    _, cmds, state = run_fake(triton_image, {}, {**data, "image_mirror_auth": False})
    assert not state.failed_hosts and "docker login" not in "\n".join(cmds)


def test_the_mirror_host_gets_debians_registry_as_a_proxy_of_the_upstream(monkeypatch, tmp_path):
    from tests.support.fakehost import run_fake
    from tritonfleet.steps.mirror import CONFIG, DROP_IN, HTPASSWD, image_mirror

    monkeypatch.setenv("TRITONFLEET_REGISTRY_PASSWORD", "s3cr3t")
    monkeypatch.setenv("TRITONFLEET_MIRROR_PASSWORD", CLIENT_SECRET)
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
    assert config["proxy"] == {"remoteurl": "https://nvcr.io", "username": "$oauthtoken"}  # the password: SECRET
    assert config["http"]["addr"] == "mirror.local:5000"  # the address the hosts pull through, not every one
    assert config["http"]["tls"] == {"certificate": "/etc/docker/registry/mirror.crt",
                                     "key": "/etc/docker/registry/mirror.key"}
    assert "Restart=on-failure" in host.connector.uploads[DROP_IN]
    # every client logs in: the mirror-only credential's bcrypt hash, written on the host by htpasswd
    assert config["auth"] == {"htpasswd": {"realm": "tritonfleet image mirror", "path": HTPASSWD}}
    assert "apache2-utils" in run and f"f={HTPASSWD}; u=tritonfleet" in run
    # a host outside the mirror group gets nothing of it
    _, cmds, _ = run_fake(image_mirror, {}, data)
    assert not any("docker-registry" in c for c in cmds)


SECRET_VALUE = "nvapi-DEMO-SECRET-123"


def _every_byte_of_a_mirror_run(monkeypatch, caplog, capfd):
    """Run the mirror step on pyinfra's @fake connector as `pyinfra --diff -vvv` does (diffs,
    input, output and facts printed); everything the run produced: its log at DEBUG, its stdout
    and stderr, the commands, the uploads, every operation's names, arguments and global
    arguments; and the stdin each command was given."""
    import logging

    from pyinfra.api import Config, Inventory, State
    from pyinfra.api.connect import connect_all
    from pyinfra.api.deploy import add_deploy
    from pyinfra.api.operations import run_ops

    from tests.support.fakehost import defaults, record_uploads
    from tritonfleet.steps.mirror import image_mirror

    monkeypatch.setenv("TRITONFLEET_REGISTRY_PASSWORD", SECRET_VALUE)
    monkeypatch.setenv("TRITONFLEET_MIRROR_PASSWORD", CLIENT_SECRET)
    caplog.set_level(logging.DEBUG)
    data = {**defaults("t4"), "fake_delay": 0, "fake_delay_jitter": 0, "image_mirror": "mirror.local:5000",
            "registry_user": "$oauthtoken", "image_mirror_group": "t4"}
    inventory = Inventory(([("@fake/mirror1", data)], {}), t4=(["@fake/mirror1"], {}))
    host = inventory.get_host("@fake/mirror1")
    state = State(inventory, Config(DIFF=True), check_for_changes=True)
    state.print_output = state.print_input = state.print_fact_output = True
    connect_all(state)
    record_uploads(host)
    stdin: list[str] = []
    run = host.connector.run_shell_command

    def recording(command, *a, **kw):
        stdin.append(str(kw.get("_stdin") or ""))
        return run(command, *a, **kw)

    host.connector.run_shell_command = recording
    add_deploy(state, image_mirror)
    plan = []
    for op_hash in state.get_op_order():
        meta = state.get_op_meta(op_hash)
        op = state.get_op_data_for_host(host, op_hash)
        plan.append(repr((meta.names, meta.args, op.global_arguments)))
    run_ops(state)
    out = capfd.readouterr()
    return state, host, stdin, "\n".join([
        caplog.text, out.out, out.err, *host.connector.executed_commands, *host.connector.uploads.values(), *plan])


def test_the_upstream_password_is_in_no_byte_of_the_plan_output_or_commands(monkeypatch, caplog, capfd):
    """security-review-2 findings 9 and 8: the mirror's upstream password reached config.yml and
    so pyinfra's --diff. Now config.yml has no password; the secret goes to the host on the stdin
    of the one command that writes the registry's environment file, read when it runs. The
    mirror's client password likewise: on the stdin of the one command that hashes it into the
    htpasswd file."""
    from tritonfleet.serving.image_mirror import PASSWORD_VAR
    from tritonfleet.steps.mirror import DROP_IN, HTPASSWD, SECRET

    state, host, stdin, everything = _every_byte_of_a_mirror_run(monkeypatch, caplog, capfd)
    assert not state.failed_hosts
    assert SECRET_VALUE not in everything and CLIENT_SECRET not in everything
    assert f"EnvironmentFile=-{SECRET}" in host.connector.uploads[DROP_IN]
    given = [s for s in stdin if s]
    assert given == [SECRET_VALUE, CLIENT_SECRET]  # the one command that writes each, on its stdin
    writer = host.connector.executed_commands[stdin.index(SECRET_VALUE)]
    assert SECRET in writer and PASSWORD_VAR in writer and "try-restart docker-registry" in writer
    writer = host.connector.executed_commands[stdin.index(CLIENT_SECRET)]
    assert HTPASSWD in writer and "htpasswd -B" in writer and "try-restart docker-registry" in writer


@pytest.mark.parametrize("secret", [None, "", "two\nlines", "x" * 73])
def test_a_mirror_deploy_without_a_usable_client_secret_is_refused_naming_the_fix(monkeypatch, secret):
    """image_mirror_auth is on by default: a mirror deploy whose client password is missing, or
    one the hosts' login and the htpasswd file cannot hold, stops before any host is touched,
    naming the variable and the fix (never the value)."""
    from tests.support.fakehost import run_fake
    from tritonfleet.settings.access import ConfigError
    from tritonfleet.steps.mirror import image_mirror

    monkeypatch.delenv("TRITONFLEET_MIRROR_PASSWORD", raising=False)
    if secret is not None:
        monkeypatch.setenv("TRITONFLEET_MIRROR_PASSWORD", secret)
    data = {"image_mirror": "mirror.local:5000", "image_mirror_group": "t4"}
    with pytest.raises(ConfigError, match=r"\$TRITONFLEET_MIRROR_PASSWORD on the control machine .*export the "
                                          r"mirror's client password there.*image_mirror_auth = False") as e:
        run_fake(image_mirror, {}, data)
    assert not secret or secret not in str(e.value)
    # an open mirror needs none (and removes the logins it had)
    _, cmds, state = run_fake(image_mirror, {}, {**data, "image_mirror_auth": False})
    assert not state.failed_hosts and "htpasswd -B" not in "\n".join(cmds)


@pytest.mark.parametrize("secret", [None, "two\nlines"])
def test_preflight_refuses_a_pull_through_the_mirror_without_its_client_secret(monkeypatch, secret):
    from pyinfra.api import Config, Inventory, State
    from pyinfra.context import ctx_host, ctx_state

    from tritonfleet import preflight
    from tritonfleet.settings.defaults import DEFAULTS

    monkeypatch.delenv("TRITONFLEET_MIRROR_PASSWORD", raising=False)
    if secret is not None:
        monkeypatch.setenv("TRITONFLEET_MIRROR_PASSWORD", secret)
    image = f"nvcr.io/nvidia/tritonserver:24.08-py3@{DIGEST}"
    data = {**DEFAULTS, "image_mirror": "mirror.local:5000", "triton_image": image}
    inventory = Inventory(([("@fake/h1", data)], {}))
    h = inventory.get_host("@fake/h1")
    with ctx_state.use(State(inventory, Config())), ctx_host.use(h):
        monkeypatch.setattr(preflight, "pulls", lambda settings, images: images)
        with pytest.raises(preflight.PreflightError, match=r"pulled through the image mirror mirror.local:5000.*"
                                                           r"\$TRITONFLEET_MIRROR_PASSWORD"):
            preflight.check_registry_secret([preflight.access.get("triton_image")])
        monkeypatch.setenv("TRITONFLEET_MIRROR_PASSWORD", CLIENT_SECRET)
        preflight.check_registry_secret([preflight.access.get("triton_image")])  # passes
        monkeypatch.delenv("TRITONFLEET_MIRROR_PASSWORD")
        h.data.image_mirror_auth = False
        preflight.check_registry_secret([preflight.access.get("triton_image")])  # an open mirror: no login


def test_the_secret_file_is_written_root_only_and_restarts_only_on_a_change(tmp_path):
    """The environment file's writer, run by sh with the secret on stdin: 0600, the value as
    systemd reads it, ``secret same`` the second time; a value the file cannot hold is refused."""
    import os
    import stat
    import subprocess

    from tritonfleet.serving.image_mirror import PASSWORD_VAR, secret_file_script

    path = tmp_path / "etc" / "upstream.env"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "systemctl").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/restarts\n")
    (bindir / "systemctl").chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}

    def write(secret: str):
        return subprocess.run(["sh", "-c", secret_file_script(str(path), "docker-registry")], input=secret,
                              capture_output=True, text=True, env=env, timeout=30)

    for value, said in ((SECRET_VALUE, "secret changed"), (SECRET_VALUE, "secret same"),
                        ("nvapi-$(id)-`x` 2", "secret changed")):
        res = write(value + "\n")
        assert res.stdout.strip() == said, res
        assert path.read_text() == f"{PASSWORD_VAR}='{value}'\n"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_uid == 0
    assert (tmp_path / "restarts").read_text().splitlines() == ["try-restart docker-registry"] * 2
    for bad in ("a'b", "a\\b", "", "first\nsecond"):
        res = write(bad + "\n")
        assert res.returncode == 2 and res.stdout.startswith("error"), res
        assert path.read_text() == f"{PASSWORD_VAR}='nvapi-$(id)-`x` 2'\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["upstream.env"]


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




def _fill_run(monkeypatch, secret: str | None):
    """mirror_filled on the fake mirror host (its manifest and fill answered), with the client
    password ``secret`` in the environment: (state, the commands, the stdin each was given)."""
    import json

    from tests.support.fakehost import run_fake
    from tritonfleet.steps.mirror import mirror_filled

    monkeypatch.delenv("TRITONFLEET_MIRROR_PASSWORD", raising=False)
    if secret is not None:
        monkeypatch.setenv("TRITONFLEET_MIRROR_PASSWORD", secret)
    blobs = ["sha256:" + c * 64 for c in "de"]
    manifest = json.dumps({"config": {"digest": blobs[0]}, "layers": [{"digest": blobs[1]}]})
    stdin: list[str] = []
    from pyinfra.connectors.fake import FakeConnector

    run = FakeConnector.run_shell_command

    def recording(self, command, *a, **kw):
        stdin.append(str(kw.get("_stdin") or ""))
        return run(self, command, *a, **kw)

    monkeypatch.setattr(FakeConnector, "run_shell_command", recording)
    data = {"image_mirror": "mirror.local:5000", "image_mirror_group": "t4",
            "triton_image": f"nvcr.io/nvidia/tritonserver:24.08-py3@{DIGEST}"}
    _, cmds, state = run_fake(mirror_filled, {"/manifests/": manifest,
                                              "fill()": [f"cached {b}" for b in blobs]}, data)
    return state, cmds, stdin


def test_the_fill_logs_in_to_the_mirror_with_the_secret_on_stdin_only(monkeypatch, caplog, capfd):
    """The mirror's own fill is a client too: its manifest request and its fill get the client
    password on stdin (a header file the shell writes), in no command line or output; without
    the password the fill fails naming the variable before it asks the mirror anything."""
    import logging

    caplog.set_level(logging.DEBUG)
    state, cmds, stdin = _fill_run(monkeypatch, CLIENT_SECRET)
    assert not state.failed_hosts
    fills = [i for i, c in enumerate(cmds) if "/manifests/" in c or "fill()" in c]
    assert len(fills) == 2 and all(stdin[i] == CLIENT_SECRET for i in fills)
    assert all('-H "@$h"' in cmds[i] for i in fills)
    out = capfd.readouterr()
    assert CLIENT_SECRET not in "\n".join(cmds) + caplog.text + out.out + out.err
    state, cmds, _ = _fill_run(monkeypatch, None)
    assert state.failed_hosts and not any("/manifests/" in c for c in cmds)
    assert "$TRITONFLEET_MIRROR_PASSWORD on the control machine is empty" in caplog.text + capfd.readouterr().err


FANOUT_MARKS = ("aria2", "opentracker", "tritonfleet-image-fanout", "imgfan", "docker-registry")


def _image_commands(step, monkeypatch, **data) -> list[str]:
    from tests.support.fakehost import run_fake

    monkeypatch.setenv("TRITONFLEET_MIRROR_PASSWORD", CLIENT_SECRET)
    base = {"image_mirror": "mirror.local:5000", "triton_image": f"nvcr.io/nvidia/tritonserver:24.08-py3@{DIGEST}"}
    _, cmds, state = run_fake(step, {}, {**base, **data})
    assert not state.failed_hosts
    return [str(c) for c in cmds]


def test_the_push_deploy_sends_the_same_image_commands_whatever_image_fanout_says(monkeypatch):
    """deploys/triton.py's image step (triton_image) never passes the image fan-out: its commands
    are the same byte for byte with image_fanout off (the default), off by name, and on."""
    from tritonfleet.steps.triton import triton_image

    default = _image_commands(triton_image, monkeypatch)
    assert default == _image_commands(triton_image, monkeypatch, image_fanout=False)
    assert default == _image_commands(triton_image, monkeypatch, image_fanout=True)
    assert not [c for c in default if any(m in c for m in FANOUT_MARKS)], default


def test_staging_with_image_fanout_off_sends_what_the_push_deploy_sends_and_on_adds_the_fanout(monkeypatch):
    """stage_image with image_fanout off: the push deploy's image commands exactly (login, pull
    through the mirror); on: the fan-out's packages before the same pull."""
    from tritonfleet.steps.stage import stage_image
    from tritonfleet.steps.triton import triton_image

    push = _image_commands(triton_image, monkeypatch)
    off = _image_commands(stage_image, monkeypatch)
    def changes(cmds):  # what changes the host (the reads differ: the push step batches its facts)
        return [c for c in cmds if c.startswith(("docker login", "docker pull"))]

    assert changes(off) == changes(push) and len(changes(push)) == 2
    assert not [c for c in off if any(m in c for m in FANOUT_MARKS)], off
    on = _image_commands(stage_image, monkeypatch, image_fanout=True)
    assert any("aria2" in c for c in on) and changes(on) == changes(push)
