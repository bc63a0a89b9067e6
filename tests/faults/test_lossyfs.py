"""LossyFS (tests/lossyfs.py), the test suite's power-cut file system: what a crash keeps
and loses, its injected faults, its counts, and that it otherwise behaves as a local disk
(flock, os.replace, O_APPEND, O_EXCL, ftruncate, unlink of open files)."""
from __future__ import annotations

import errno
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.lossyfs import LossyFS, fuse_available
from tests.waiting import wait_until


def fsync_file(path: Path, datasync: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        (os.fdatasync if datasync else os.fsync)(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def durable_file(path: Path, data: bytes) -> Path:
    """``path`` with ``data``, its data and its directory entry both durable."""
    path.write_bytes(data)
    fsync_file(path)
    fsync_dir(path.parent)
    return path


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


# --- what a crash keeps ----------------------------------------------------------------------

def test_an_unsynced_write_is_lost_at_crash(lossyfs):
    f = durable_file(lossyfs.mountpoint / "log", b"kept")
    append(f, b" lost")
    assert f.read_bytes() == b"kept lost"
    lossyfs.crash()
    assert f.read_bytes() == b"kept"
    assert f.stat().st_size == 4


def test_fsynced_data_survives_a_crash(lossyfs):
    f = durable_file(lossyfs.mountpoint / "log", b"one")
    append(f, b" two")
    fsync_file(f)
    lossyfs.crash()
    assert f.read_bytes() == b"one two"


def test_an_unsynced_truncate_is_undone_at_crash(lossyfs):
    f = durable_file(lossyfs.mountpoint / "log", b"0123456789")
    with open(f, "r+b") as fh:
        os.ftruncate(fh.fileno(), 3)
    assert f.stat().st_size == 3
    lossyfs.crash()
    assert f.read_bytes() == b"0123456789"


def test_an_fsync_makes_overwrites_and_truncates_inside_the_file_durable(lossyfs):
    f = durable_file(lossyfs.mountpoint / "log", b"0123456789")
    with open(f, "r+b", buffering=0) as fh:
        fh.seek(2)
        fh.write(b"ab")
        os.fsync(fh.fileno())
        lossyfs.crash()
        assert f.read_bytes() == b"01ab456789"
        os.ftruncate(fh.fileno(), 3)
        os.ftruncate(fh.fileno(), 5)
        os.fsync(fh.fileno())
        lossyfs.crash()
        assert f.read_bytes() == b"01a\0\0"
        fh.seek(8)
        fh.write(b"z")
        os.fsync(fh.fileno())
        lossyfs.crash()
        assert f.read_bytes() == b"01a\0\0\0\0\0z"


def test_a_new_file_fsynced_without_its_directory_is_lost_at_crash(lossyfs):
    f = lossyfs.mountpoint / "new"
    f.write_bytes(b"data")
    fsync_file(f)
    lossyfs.crash()
    assert not f.exists()
    assert os.listdir(lossyfs.mountpoint) == []


def test_a_new_file_survives_a_crash_once_its_directory_is_fsynced(lossyfs):
    f = lossyfs.mountpoint / "new"
    f.write_bytes(b"data")
    fsync_file(f)
    fsync_dir(lossyfs.mountpoint)
    lossyfs.crash()
    assert f.read_bytes() == b"data"


def test_a_durable_entry_without_fsynced_data_comes_back_empty(lossyfs):
    f = lossyfs.mountpoint / "new"
    f.write_bytes(b"data")
    fsync_dir(lossyfs.mountpoint)
    lossyfs.crash()
    assert f.exists() and f.read_bytes() == b""


def test_a_new_directory_and_its_files_need_each_directory_fsynced(lossyfs):
    d = lossyfs.mountpoint / "spool"
    d.mkdir()
    durable_file(d / "a", b"a")  # d's entry for a is durable, the root's entry for d is not
    lossyfs.crash()
    assert not d.exists()
    d.mkdir()
    fsync_dir(lossyfs.mountpoint)
    durable_file(d / "a", b"a")
    lossyfs.crash()
    assert os.listdir(d) == ["a"] and (d / "a").read_bytes() == b"a"


def test_an_unlink_not_made_durable_is_undone_at_crash(lossyfs):
    f = durable_file(lossyfs.mountpoint / "f", b"x")
    f.unlink()
    lossyfs.crash()
    assert f.read_bytes() == b"x"
    f.unlink()
    fsync_dir(lossyfs.mountpoint)
    lossyfs.crash()
    assert not f.exists()


def test_a_rename_not_made_durable_reverts_at_crash(lossyfs):
    old = durable_file(lossyfs.mountpoint / "a.tmp", b"new")
    target = durable_file(lossyfs.mountpoint / "a", b"old")
    os.replace(old, target)
    assert target.read_bytes() == b"new" and not old.exists()
    lossyfs.crash()
    assert old.read_bytes() == b"new"
    assert target.read_bytes() == b"old"


def test_os_replace_made_durable_survives_a_crash(lossyfs):
    target = durable_file(lossyfs.mountpoint / "state", b"old")
    tmp = lossyfs.mountpoint / "state.tmp"
    tmp.write_bytes(b"new")
    fsync_file(tmp)
    os.replace(tmp, target)
    fsync_dir(lossyfs.mountpoint)
    lossyfs.crash()
    assert sorted(os.listdir(lossyfs.mountpoint)) == ["state"]
    assert target.read_bytes() == b"new"


def test_a_rename_across_directories_needs_both_directories_fsynced(lossyfs):
    src, dst = lossyfs.mountpoint / "src", lossyfs.mountpoint / "dst"
    src.mkdir()
    dst.mkdir()
    fsync_dir(lossyfs.mountpoint)
    durable_file(src / "f", b"x")
    os.rename(src / "f", dst / "f")
    fsync_dir(dst)
    lossyfs.crash()
    # The target's entry is durable, the source's removal is not: both names are back.
    assert os.listdir(src) == ["f"] and os.listdir(dst) == ["f"]
    os.unlink(src / "f")
    fsync_dir(src)
    lossyfs.crash()
    assert os.listdir(src) == [] and (dst / "f").read_bytes() == b"x"


def test_fdatasync_makes_data_durable_and_counts_as_fdatasync(lossyfs):
    f = durable_file(lossyfs.mountpoint / "log", b"a")
    before = lossyfs.counts()
    append(f, b"b")
    fsync_file(f, datasync=True)
    lossyfs.crash()
    assert f.read_bytes() == b"ab"
    after = lossyfs.counts()
    assert after["fdatasync"] == before["fdatasync"] + 1
    assert after["fsync"] == before["fsync"]


def test_a_sync_through_any_descriptor_of_the_file_makes_it_durable(lossyfs):
    f = durable_file(lossyfs.mountpoint / "log", b"")
    with open(f, "ab") as writer:
        writer.write(b"written here")
        writer.flush()
        fsync_file(f)  # another descriptor, read-only
    lossyfs.crash()
    assert f.read_bytes() == b"written here"


def test_reads_after_a_crash_see_the_durable_state_through_an_open_descriptor(lossyfs):
    f = durable_file(lossyfs.mountpoint / "log", b"durable")
    with open(f, "r+b", buffering=0) as fh:
        assert fh.read() == b"durable"
        # Same size, same times: nothing would tell a page cache that the data changed.
        fh.seek(0)
        fh.write(b"VOLATIL")
        fh.seek(0)
        assert fh.read() == b"VOLATIL"
        lossyfs.crash()
        fh.seek(0)
        assert fh.read() == b"durable"
        fh.write(b" and volatile")
        fh.seek(0)
        assert fh.read() == b"durable and volatile"
        assert os.fstat(fh.fileno()).st_size == 20
        lossyfs.crash()
        fh.seek(0)
        assert fh.read() == b"durable"
        assert os.fstat(fh.fileno()).st_size == 7
    assert f.read_bytes() == b"durable"
    assert f.stat().st_size == 7


def test_an_append_descriptor_kept_across_a_crash_appends_at_the_durable_end(lossyfs):
    f = durable_file(lossyfs.mountpoint / "log", b"kept")
    with open(f, "ab", buffering=0) as fh:
        fh.write(b" lost")
        lossyfs.crash()
        fh.write(b"+")
    assert f.read_bytes() == b"kept+"


def test_sync_makes_everything_durable(lossyfs):
    d = lossyfs.mountpoint / "d"
    d.mkdir()
    (d / "f").write_bytes(b"x")
    lossyfs.sync()
    lossyfs.crash()
    assert (d / "f").read_bytes() == b"x"


# --- faults ----------------------------------------------------------------------------------

def test_fsync_eio_raises_and_leaves_the_data_volatile(lossyfs):
    buf = durable_file(lossyfs.mountpoint / "1.buf", b"a")
    other = durable_file(lossyfs.mountpoint / "other", b"a")
    lossyfs.fail_fsync(True, "*.buf")
    append(buf, b"b")
    append(other, b"b")
    with pytest.raises(OSError) as failed:
        fsync_file(buf)
    assert failed.value.errno == errno.EIO
    with pytest.raises(OSError) as failed:
        fsync_file(buf, datasync=True)
    assert failed.value.errno == errno.EIO
    fsync_file(other)  # the pattern spares it
    assert lossyfs.counts()["fsync_eio"] == 2
    lossyfs.crash()
    assert buf.read_bytes() == b"a" and other.read_bytes() == b"ab"
    lossyfs.fail_fsync(False)
    append(buf, b"c")
    fsync_file(buf)
    lossyfs.crash()
    assert buf.read_bytes() == b"ac"


def test_fsync_eio_for_every_name_covers_directories(lossyfs):
    lossyfs.fail_fsync(True)
    (lossyfs.mountpoint / "f").write_bytes(b"x")
    with pytest.raises(OSError) as failed:
        fsync_dir(lossyfs.mountpoint)
    assert failed.value.errno == errno.EIO
    lossyfs.crash()
    assert os.listdir(lossyfs.mountpoint) == []


def test_write_enospc_refuses_writes_until_turned_off(lossyfs):
    f = lossyfs.mountpoint / "f"
    lossyfs.fail_write_enospc(True)
    with pytest.raises(OSError) as failed:
        with open(f, "wb", buffering=0) as fh:
            fh.write(b"x")
    assert failed.value.errno == errno.ENOSPC
    assert f.read_bytes() == b""
    lossyfs.fail_write_enospc(False)
    f.write_bytes(b"x")
    assert f.read_bytes() == b"x"
    assert lossyfs.counts()["write_enospc"] == 1


def test_counts_count_syncs_directory_syncs_and_writes(lossyfs):
    f = lossyfs.mountpoint / "f"
    with open(f, "wb", buffering=0) as fh:
        for _ in range(5):
            fh.write(b"12345")
        os.fsync(fh.fileno())
        os.fdatasync(fh.fileno())
    fsync_dir(lossyfs.mountpoint)
    lossyfs.crash()
    counts = lossyfs.counts()
    assert {k: counts[k] for k in ("fsync", "fdatasync", "fsyncdir", "write", "write_bytes",
                                   "crash")} == {"fsync": 1, "fdatasync": 1, "fsyncdir": 1,
                                                 "write": 5, "write_bytes": 25, "crash": 1}


# --- behaves as a local disk -----------------------------------------------------------------

def test_flock_and_posix_locks_are_exclusive_between_processes(lossyfs):
    # The broker flocks its spool directory's lock file; the kernel keeps both kinds of lock.
    lock = lossyfs.mountpoint / "lock"
    lock.touch()
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, sys; f = open(sys.argv[1], 'r+'); fcntl.flock(f, fcntl.LOCK_EX);"
         "fcntl.lockf(f, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
         str(lock)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with open(lock, "r+") as f:
            with pytest.raises(BlockingIOError):
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            with pytest.raises(OSError) as refused:
                fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            assert refused.value.errno in (errno.EACCES, errno.EAGAIN)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(10)
    with open(lock, "r+") as f:  # free once the holder has gone
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_posix_file_operations_behave_as_on_a_local_disk(lossyfs):
    mnt = lossyfs.mountpoint
    # O_EXCL
    fd = os.open(mnt / "x", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    os.close(fd)
    with pytest.raises(FileExistsError):
        os.open(mnt / "x", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    # O_APPEND through two descriptors interleaves, never overwrites
    a = os.open(mnt / "x", os.O_WRONLY | os.O_APPEND)
    b = os.open(mnt / "x", os.O_WRONLY | os.O_APPEND)
    for _ in range(3):
        os.write(a, b"a")
        os.write(b, b"bb")
    os.close(a)
    os.close(b)
    assert (mnt / "x").read_bytes() == b"abbabbabb"
    assert os.stat(mnt / "x").st_size == 9
    # ftruncate, both ways, and a write past the end
    with open(mnt / "x", "r+b", buffering=0) as fh:
        os.ftruncate(fh.fileno(), 2)
        assert os.fstat(fh.fileno()).st_size == 2
        os.ftruncate(fh.fileno(), 4)
        fh.seek(6)
        fh.write(b"z")
    assert (mnt / "x").read_bytes() == b"ab\0\0\0\0z"
    # rename over an existing file
    (mnt / "y").write_bytes(b"y")
    os.replace(mnt / "y", mnt / "x")
    assert (mnt / "x").read_bytes() == b"y" and not (mnt / "y").exists()
    # unlink of an open file: readable and writable through its descriptor, gone by name
    with open(mnt / "x", "r+b", buffering=0) as fh:
        os.unlink(mnt / "x")
        assert os.listdir(mnt) == []
        fh.write(b"Y")
        fh.seek(0)
        assert fh.read() == b"Y"
        assert os.fstat(fh.fileno()).st_nlink == 0
    # directories: listdir, scandir, stat sizes, rmdir of a non-empty one
    (mnt / "d").mkdir()
    (mnt / "d" / "f1").write_bytes(b"1")
    (mnt / "d" / "f22").write_bytes(b"22")
    assert sorted(os.listdir(mnt / "d")) == ["f1", "f22"]
    sizes = {e.name: e.stat().st_size for e in os.scandir(mnt / "d")}
    assert sizes == {"f1": 1, "f22": 2}
    assert all(e.is_file() for e in os.scandir(mnt / "d"))
    with pytest.raises(OSError) as failed:
        os.rmdir(mnt / "d")
    assert failed.value.errno == errno.ENOTEMPTY
    (mnt / "empty").mkdir()
    with pytest.raises(IsADirectoryError):
        os.replace(mnt / "d" / "f1", mnt / "empty")
    os.rmdir(mnt / "empty")
    os.link(mnt / "d" / "f1", mnt / "d" / "hard")
    assert os.stat(mnt / "d" / "f1").st_nlink == 2
    os.rename(mnt / "d", mnt / "e")
    assert sorted(os.listdir(mnt / "e")) == ["f1", "f22", "hard"]


# --- the process around it -------------------------------------------------------------------

def test_stop_unmounts_and_ends_the_process_and_so_does_a_dead_test_process(tmp_path):
    if reason := fuse_available():
        pytest.skip(reason)
    fs = LossyFS(tmp_path / "mnt").start()
    proc = fs.proc
    assert os.path.ismount(fs.mountpoint)
    fs.stop()
    assert proc is not None and proc.returncode == 0, fs.log()
    assert not os.path.ismount(fs.mountpoint)
    # The test process dying closes the control channel: the file system unmounts itself.
    fs = LossyFS(tmp_path / "mnt2").start()
    try:
        assert fs.proc is not None and fs.proc.stdin is not None
        fs.proc.stdin.close()
        wait_until(lambda: fs.proc is not None and fs.proc.poll() is not None, 10,
                   "lossyfs to end on end of input")
        assert not os.path.ismount(fs.mountpoint)
    finally:
        fs.stop()


def test_a_bad_request_is_answered_and_the_mount_keeps_serving(lossyfs):
    assert lossyfs.proc is not None and lossyfs.proc.stdin is not None
    with pytest.raises(RuntimeError, match="unknown op"):
        lossyfs._request("format")
    lossyfs.proc.stdin.write(b"not json\n")
    lossyfs.proc.stdin.flush()
    assert json.loads(lossyfs._read_line(10))["ok"] is False
    (lossyfs.mountpoint / "f").write_bytes(b"x")
    assert (lossyfs.mountpoint / "f").read_bytes() == b"x"


# --- against a model -------------------------------------------------------------------------

class CrashMachine(RuleBasedStateMachine):
    """Writes, truncates, renames, unlinks, fsyncs and crashes on a mount, each checked against
    a model: names to inodes, now and as last made durable; each inode's data, likewise."""

    def __init__(self, fs: LossyFS) -> None:
        super().__init__()
        self.mnt = fs.mountpoint
        self.fs = fs
        for name in os.listdir(self.mnt):  # each run starts from an empty, durable directory
            os.unlink(self.mnt / name)
        fsync_dir(self.mnt)
        self.names: dict[str, int] = {}
        self.durable_names: dict[str, int] = {}
        self.data: dict[int, bytes] = {}
        self.durable_data: dict[int, bytes] = {}

    def existing(self, pick: int) -> str:
        return sorted(self.names)[pick % len(self.names)]

    @rule(name=st.sampled_from(["a", "b"]), chunk=st.binary(min_size=1, max_size=6))
    def append(self, name, chunk):
        if name not in self.names:
            self.names[name] = len(self.data)
            self.data[self.names[name]] = b""
        self.data[self.names[name]] += chunk
        append(self.mnt / name, chunk)

    @precondition(lambda self: self.names)
    @rule(pick=st.integers(0, 1), offset=st.integers(0, 12), chunk=st.binary(min_size=1, max_size=6))
    def pwrite(self, pick, offset, chunk):
        name = self.existing(pick)
        old = self.data[self.names[name]].ljust(offset, b"\0")
        self.data[self.names[name]] = old[:offset] + chunk + old[offset + len(chunk):]
        with open(self.mnt / name, "r+b") as fh:
            fh.seek(offset)
            fh.write(chunk)

    @precondition(lambda self: self.names)
    @rule(pick=st.integers(0, 1), size=st.integers(0, 12))
    def truncate(self, pick, size):
        name = self.existing(pick)
        self.data[self.names[name]] = self.data[self.names[name]][:size].ljust(size, b"\0")
        os.truncate(self.mnt / name, size)

    @precondition(lambda self: self.names)
    @rule(pick=st.integers(0, 1), datasync=st.booleans())
    def fsync(self, pick, datasync):
        name = self.existing(pick)
        self.durable_data[self.names[name]] = self.data[self.names[name]]
        fsync_file(self.mnt / name, datasync)

    @rule()
    def fsync_directory(self):
        self.durable_names = dict(self.names)
        fsync_dir(self.mnt)

    @precondition(lambda self: self.names)
    @rule(pick=st.integers(0, 1), new=st.sampled_from(["a", "b"]))
    def rename(self, pick, new):
        old = self.existing(pick)
        if old != new:
            self.names[new] = self.names.pop(old)
            os.rename(self.mnt / old, self.mnt / new)

    @precondition(lambda self: self.names)
    @rule(pick=st.integers(0, 1))
    def unlink(self, pick):
        name = self.existing(pick)
        del self.names[name]
        os.unlink(self.mnt / name)

    @rule()
    def crash(self):
        self.names = dict(self.durable_names)
        for ino in self.names.values():
            self.data[ino] = self.durable_data.get(ino, b"")
        self.fs.crash()

    @invariant()
    def the_mount_shows_the_model(self):
        assert sorted(os.listdir(self.mnt)) == sorted(self.names)
        for name, ino in self.names.items():
            assert (self.mnt / name).read_bytes() == self.data[ino], name


def test_a_crash_keeps_exactly_what_the_syncs_made_durable(lossyfs):
    run_state_machine_as_test(
        lambda: CrashMachine(lossyfs),
        settings=settings(max_examples=100, stateful_step_count=25, deadline=None,
                          database=None))
