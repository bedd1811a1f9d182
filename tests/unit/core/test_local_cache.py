"""What the control machine remembers between runs (tritonfleet.core.local_cache): read back as
written, and nothing else read back as if it had been."""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tritonfleet.core import local_cache


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(), other=st.text())
@example(text="\r", other="")  # text mode reads a lone "\r" back as "\n"
@example(text="a\r\nb", other="a\nb")
def test_a_remembered_text_reads_back_and_a_changed_one_does_not(tmp_path, text, other):
    path = tmp_path / "kind" / "key"
    local_cache.write(path, text)
    assert local_cache.read(path) == text
    seal = path.read_bytes().split(b"\n", 1)[0]
    if other != text:
        path.write_bytes(seal + b"\n" + other.encode())  # the same first line, another text
        assert local_cache.read(path) is None
    path.write_bytes(other.encode())  # written by something else (no sha256 line of its own)
    assert local_cache.read(path) is None
    assert local_cache.read(tmp_path / "absent") is None


def test_a_cache_that_cannot_be_written_costs_nothing_but_the_work(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    local_cache.write(tmp_path / "file" / "kind" / "key", "text")  # no error
    assert local_cache.read(tmp_path / "file" / "kind" / "key") is None


def test_the_digest_tells_the_parts_apart():
    assert local_cache.digest("ab", "c") != local_cache.digest("a", "bc")
    assert local_cache.digest("ab", "c") == local_cache.digest(b"ab", b"c")
