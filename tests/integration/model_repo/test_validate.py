"""The validator against the real tritonserver, on the corpus under tests/corpus (the pure half,
the validator's own rules on the same corpus: tests/unit/model_repo/test_validate.py).

Every case is loaded by the tritonserver of the nvidia-pytriton wheel (strict model config, exit
on error, no GPU) and the verdicts are compared: a repository Triton refuses must never pass the
validator; and the schema compiled into the bundled libtritonserver against tritonclient's.
"""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.internal.decoder import _DecodeVarint
from tritonclient.grpc import model_config_pb2

from tests.unit.model_repo.test_validate import CASES, CORPUS, kind, triton_expected
from tritonfleet.model_repo.validate import (
    NEWER_FIELDS,
    list_models,
    validate_repository,
)
from tritonfleet_testbed.localtriton import LocalTriton, find_tritonserver
from tritonfleet_testbed.standin_images import backend_model_py


def _triton_verdict(repo: Path) -> tuple[bool, str]:
    with LocalTriton(
        repo,
        strict_model_config=True,
        exit_on_error=True,
        python_based_backends={"onnxruntime": backend_model_py()},
        ready_timeout=60,
        require_ready=False,
    ) as triton:
        accepted = triton.ready and all(triton.model_ready(m) for m in list_models(repo))
        return accepted, triton.log


@pytest.fixture(scope="module")
def triton_verdicts(tmp_path_factory) -> dict[str, tuple[bool, str]]:
    """{case: (this tritonserver loaded every model, its log)} for the whole corpus."""
    copy = tmp_path_factory.mktemp("corpus") / "corpus"
    shutil.copytree(CORPUS, copy, symlinks=True)  # relative links keep their meaning
    # 16 at once on any machine: a server mostly waits (its stop takes ~3 s, Triton checks once a
    # second whether its models have unloaded), about 90 MiB each
    with ThreadPoolExecutor(16) as pool:
        results = pool.map(lambda c: (c, _triton_verdict(copy / c)), sorted(CASES))
        return dict(results)


def test_triton_verdicts_are_the_manifests(triton_verdicts):
    """The corpus says true things about Triton: each case loads or fails as stated."""
    wrong = {c: log[-1500:] for c, (accepted, log) in triton_verdicts.items()
             if accepted != triton_expected(c)}
    assert not wrong, wrong


def test_no_repository_triton_refuses_passes_the_validator(triton_verdicts):
    false_accepts = {}
    for case, (accepted, log) in triton_verdicts.items():
        if kind(case) == "limits" or accepted:
            continue
        if not validate_repository(CORPUS / case, gpus=0):
            false_accepts[case] = log[-1500:]
    assert not false_accepts, false_accepts


def test_agreement_rate(triton_verdicts, record_property, capsys):
    rows = []
    for case, (accepted, _) in sorted(triton_verdicts.items()):
        valid = not validate_repository(CORPUS / case, gpus=0)
        rows.append((case, valid, accepted))
    agree = [c for c, v, a in rows if v == a]
    stricter = [c for c, v, a in rows if not v and a]
    missed = [c for c, v, a in rows if v and not a]
    summary = (f"validator vs tritonserver: {len(agree)}/{len(rows)} verdicts agree "
               f"({100 * len(agree) / len(rows):.0f}%); stricter on {len(stricter)} "
               f"({', '.join(stricter)}); missed {len(missed)} ({', '.join(missed) or 'none'})")
    record_property("agreement", summary)
    with capsys.disabled():
        print(f"\n{summary}")
    # the differences are exactly the ones the manifest explains
    assert set(stricter) == {c for c in CASES if kind(c) == "bad" and triton_expected(c)}
    assert set(missed) == {c for c in CASES if kind(c) == "limits"}
    assert len(agree) / len(rows) >= 0.85


def _server_model_config_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """model_config.proto as compiled into the bundled libtritonserver."""
    (lib,) = find_tritonserver().libs.glob("libtritonserver*.so*")
    data = lib.read_bytes()
    start = data.find(b"\n\x12model_config.proto\x12\tinference")
    assert start >= 0
    pos = start
    while True:  # walk the top-level fields of the serialized FileDescriptorProto
        tag, p = _DecodeVarint(data, pos)
        number, wire = tag >> 3, tag & 7
        if not 1 <= number <= 14 or wire not in (0, 2):
            break
        value, p = _DecodeVarint(data, p)
        pos = p + value if wire == 2 else p
    return descriptor_pb2.FileDescriptorProto.FromString(data[start:pos])


def _fields(fd) -> dict[str, set[str]]:
    """{message type: its field names} of a FileDescriptorProto."""
    out: dict[str, set[str]] = {}

    def walk(messages, prefix):
        for m in messages:
            full = f"{prefix}.{m.name}"
            out[full] = {f.name for f in m.field}
            walk(m.nested_type, full)

    walk(fd.message_type, fd.package)
    return out


def test_newer_fields_are_what_the_server_schema_lacks():
    """NEWER_FIELDS is exactly what tritonclient's schema has beyond the server's."""
    server = _fields(_server_model_config_descriptor())
    client_fd = descriptor_pb2.FileDescriptorProto()
    model_config_pb2.DESCRIPTOR.CopyToProto(client_fd)
    client = _fields(client_fd)
    assert "inference.ModelConfig" in server and len(server) > 30
    newer = {(t, f) for t, fields in client.items() if t in server for f in fields - server[t]}
    assert newer == {(t, f) for f, t in NEWER_FIELDS.items()}
    for t, fields in server.items():  # and the server knows nothing tritonclient does not
        assert fields <= client.get(t, set()), t
