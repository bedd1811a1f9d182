"""A rendered copy is a hard link to the repository's file; another run on this machine linking
the same file while it is archived moves its inode change time, and GNU tar says "file changed as
we read it" (exit 1). The transfer accepts exactly that case (size and mtime unchanged) and still
fails on a file whose content changed, or on any other tar message."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tritonfleet.pyinfra_ext import transfer

HOST = SimpleNamespace(name="tb1-t4")


def _repo(tmp_path: Path) -> tuple[Path, list[str]]:
    root = tmp_path / "rendered"
    (root / "m" / "1").mkdir(parents=True)
    (root / "m" / "1" / "model.onnx").write_bytes(os.urandom(8 << 20))  # far more than a pipe holds
    (root / "m" / "config.pbtxt").write_text('name: "m"\n')
    return root, ["m/config.pbtxt", "m/1/model.onnx"]


def _during_transfer(action) -> threading.Thread:
    """``action`` 0.5 s into a transfer whose receiver sleeps 1.5 s first: tar is blocked in the
    middle of the large file (the pipe is full) when it happens."""
    t = threading.Thread(target=lambda: (time.sleep(0.5), action()))
    t.start()
    return t


def test_a_hard_link_made_by_another_run_mid_transfer_is_not_a_failure(tmp_path):
    root, paths = _repo(tmp_path)
    other_run = tmp_path / "other-run-copy"
    t = _during_transfer(lambda: os.link(root / paths[1], other_run))
    sent = transfer.send(HOST, root, paths, "sleep 1.5; cat >/dev/null", "local")
    t.join()
    assert other_run.exists() and sent.files == 2


def test_content_changed_mid_transfer_still_fails(tmp_path):
    root, paths = _repo(tmp_path)

    def rewrite():
        with open(root / paths[1], "r+b") as f:
            f.write(b"changed")
    t = _during_transfer(rewrite)
    with pytest.raises(transfer.TransferError, match=r"tb1-t4: reading the local files .* file changed as we read it"):
        transfer.send(HOST, root, paths, "sleep 1.5; cat >/dev/null", "local")
    t.join()


def test_only_that_message_for_a_known_unchanged_file_is_accepted(tmp_path):
    root, paths = _repo(tmp_path)
    before = {p: transfer._stamp(root / p) for p in paths}
    msg = b"tar: m/1/model.onnx: file changed as we read it\n"
    assert transfer.only_links_changed(msg, root, before)
    assert not transfer.only_links_changed(b"", root, before)
    assert not transfer.only_links_changed(msg + b"tar: m/x: Cannot open: No such file or directory\n", root, before)
    assert not transfer.only_links_changed(b"tar: other/file: file changed as we read it\n", root, before)
    (root / paths[1]).write_bytes(b"shorter")
    assert not transfer.only_links_changed(msg, root, before)


def test_a_transfer_killed_with_sigkill_leaves_nothing_in_the_temporary_directory(tmp_path):
    """A run killed mid-transfer runs no clean-up: the list of names tar reads must never have had
    a name in the temporary directory (it used to be left there by every such run)."""
    import signal
    import subprocess
    import sys

    root, paths = _repo(tmp_path)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    code = ("import sys; from pathlib import Path; from types import SimpleNamespace; "
            "from tritonfleet.pyinfra_ext import transfer; "
            "transfer.send(SimpleNamespace(name='tb1-t4'), Path(sys.argv[1]), sys.argv[2:], "
            "'echo receiving; sleep 30; cat >/dev/null', 'local')")
    run = subprocess.Popen([sys.executable, "-c", code, str(root), *paths], env={**os.environ, "TMPDIR": str(tmp)},
                           start_new_session=True, cwd=Path(transfer.__file__).parents[2])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # tar is running: it has the names, and blocks on the full pipe
            tars = subprocess.run(["pgrep", "-s", str(run.pid), "-x", "tar"], capture_output=True, text=True).stdout
            if tars.strip():
                break
            time.sleep(0.05)
        assert tars.strip(), "tar never started"
        time.sleep(0.3)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    assert list(tmp.iterdir()) == []


def test_names_reach_tar_through_the_descriptor_as_they_are(tmp_path):
    """A leading dash, a backslash and a space in a name are taken as they are (the archive holds
    each file under its own name, with its own bytes)."""
    import io
    import tarfile

    root = tmp_path / "repo"
    files = {"-x": b"dash", "a b/c\\d": b"backslash", "m/1/model.onnx": os.urandom(200_000)}
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    tar = transfer._tar_process(root, sorted(files))
    out, err = tar.communicate()
    assert tar.returncode == 0, err
    with tarfile.open(fileobj=io.BytesIO(out)) as archive:
        got = {m.name: archive.extractfile(m).read() for m in archive.getmembers() if m.isfile()}
    assert got == files
