"""Registry login: which registry an image needs, and the secret travelling on stdin only."""

from __future__ import annotations

import pytest

from tritonfleet.serving.images import registry_of
from tritonfleet.serving.ops.registry import MissingSecret, SecretStdinCommand, docker_login


@pytest.mark.parametrize("image,registry", [
    ("nvcr.io/nvidia/tritonserver:24.08-py3", "nvcr.io"),
    ("nvidia/cuda:12.2.0-base-ubuntu22.04", "docker.io"),
    ("ubuntu", "docker.io"),
    ("10.77.4.1:5000/nvidia/cuda:12.2.0", "10.77.4.1:5000"),
    ("localhost/triton:1", "localhost"),
    ("registry.example:443/a/b", "registry.example:443"),
])
def test_registry_of(image, registry):
    assert registry_of(image) == registry


class RecordingHost:
    name = "h1"

    def run_shell_command(self, command, **kwargs):
        self.command, self.kwargs = command, kwargs
        return True, None


class PrintState:
    print_output = print_input = True


def test_secret_is_read_at_execution_and_sent_on_stdin_only(monkeypatch):
    secret = "s3cr3t-on-stdin-only"
    monkeypatch.delenv("REG_SECRET", raising=False)
    (cmd,) = list(docker_login._inner(registry="nvcr.io", user="$oauthtoken", secret_env="REG_SECRET"))
    assert isinstance(cmd, SecretStdinCommand)
    assert str(cmd) == "docker login --username '$oauthtoken' --password-stdin nvcr.io"
    host = RecordingHost()
    with pytest.raises(MissingSecret, match=r"h1: \$REG_SECRET is empty"):
        cmd.execute(PrintState(), host, {})
    monkeypatch.setenv("REG_SECRET", secret)
    assert secret not in repr(cmd) and secret not in str(cmd.__dict__)  # not held before execution
    cmd.execute(PrintState(), host, {"_sudo": True})
    assert host.kwargs["_stdin"] == secret and host.kwargs["_sudo"] is True
    assert secret not in host.command.get_raw_value()
