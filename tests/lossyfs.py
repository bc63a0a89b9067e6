"""LossyFS: a FUSE file system for the tests that loses every change not yet made durable
when told to, as a power cut of the host would (the way Jepsen's LazyFS does it).

    with mounted(tmp_path / "mnt") as fs:         # or the ``lossyfs`` fixture (tests/conftest.py)
        spool = fs.mountpoint / "buffers"
        spool.mkdir()
        fs.sync()                                 # the directory itself survives crashes
        broker = start_broker(db, tmp_path, FILE_BUFFER_DIR=str(spool))
        ...                                       # the broker writes, fsyncs, renames
        broker.proc.kill()                        # a power cut ends the processes too
        fs.crash()                                # every change not made durable is gone
        fs.counts()                               # {"fsync": .., "fdatasync": .., "fsyncdir": ..}

(A directory the broker makes itself, as it does FILE_BUFFER_DIR when missing, is gone after a
crash unless something fsyncs its parent: hence the ``mkdir`` and ``sync()`` first.)

The file system runs in its own process (``python tests/lossyfs.py MOUNTPOINT``, started by
:class:`LossyFS`), so any other process, such as a broker under test, reads and writes the
mount as it would a disk. It is served by libfuse 3 through the ``mfusepy`` binding, from
memory: nothing is written to disk, and the state lives as long as that process.

What is durable (the model, per inode: a current and a durable copy)
----------------------------------------------------------------------
- File data (write, truncate, ftruncate) is volatile until fsync or fdatasync of that file,
  through any descriptor of it; either makes its whole data and size durable, but NOT its
  directory entry. fdatasync is counted apart from fsync and is otherwise the same.
- Metadata (create, mknod, mkdir, unlink, rmdir, rename, link) is volatile until the parent
  directory is fsynced (``fd = os.open(dir, os.O_RDONLY); os.fsync(fd)``), which makes that
  directory's whole entry list durable as it stands. A rename across two directories needs
  both: fsyncing only the target leaves the file under both names after a crash, only the
  source under neither. After a crash a file whose entry was never made durable is gone, even
  if its data was fsynced, and a rename not made durable reverts to the old name (and brings
  back the file it replaced). A new file whose entry is durable but whose data was never
  fsynced comes back empty. A directory's own entries are durable only once it is fsynced.
- Mode, owner and times are not modelled: they keep their current values across a crash.
- :meth:`LossyFS.crash` swaps every inode to its durable copy at once, between two
  operations (one lock serialises the file system and its control channel), and keeps
  serving. The kernel holds nothing to serve in its place: every open is direct_io (no page
  cache, no writeback cache), attribute, entry and negative-entry timeouts are 0, and
  kernel_cache is off. A descriptor kept open across a crash still reads its file's durable
  state; a power cut would have ended its process, so tests kill writers first.
- Unlink of an open file keeps it readable, writable and fstat-able through its descriptors:
  libfuse renames such a file to ``.fuse_hidden...`` until its last close, and this file
  system takes that rename as the unlink it stands for (the name is never listed, nor made
  durable) while still answering to the hidden path.

Faults
------
- :meth:`LossyFS.fail_fsync`: fsync, fdatasync and directory fsyncs answer EIO, for every file
  and directory or for those whose last name matches a glob (``fnmatch``, e.g. ``"*.buf"``).
  What the failed call would have made durable stays volatile (a later fsync that succeeds
  makes it durable; the kernel's page cache, which Linux may drop after a failed writeback,
  is not modelled).
- :meth:`LossyFS.fail_write_enospc`: writes, and truncates that grow a file, answer ENOSPC.

Locks: the file system implements neither flock nor POSIX locks, so libfuse does not ask the
kernel to pass them on, and the kernel keeps them locally: they work between processes on this
host as on a local disk (tests/faults/test_lossyfs.py checks it). They are the kernel's, so a
crash does not drop them: a lock goes when its holder dies, as the broker's spool lock does.

Control channel
---------------
The process's standard input and output: one JSON object a line each way. A request
``{"op": NAME, ...}`` gets ``{"ok": true, ...}`` or ``{"ok": false, "error": TEXT}``; before
any, the process writes ``{"ready": true}`` once the kernel has finished mounting. NAMEs:
``crash``, ``sync`` (make everything durable as it stands, like sync(2)), ``fail_fsync``
(``on``, ``pattern``), ``fail_write_enospc`` (``on``), ``counts``. End of input (the test
process died) or SIGTERM unmounts the file system and ends the process; libfuse's messages
and any error go to standard error (the log file :class:`LossyFS` names).
"""
from __future__ import annotations

import contextlib
import errno
import fnmatch
import functools
import json
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["LossyFS", "fuse_available", "mounted"]


def fuse_available() -> str | None:
    """None when this host can mount FUSE file systems, else why not (for a skip reason)."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is absent: this host cannot mount FUSE file systems"
    return None


# --- the file system process ---------------------------------------------------------------

@dataclass(eq=False)
class Node:
    ino: int
    is_dir: bool
    mode: int
    name: str                      # the last name it was linked under (for fail_fsync patterns)
    data: bytearray = field(default_factory=bytearray)       # files: current data
    durable_data: bytearray = field(default_factory=bytearray)  # files: at the last fsync
    # files: the lowest offset changed since the last fsync (None: data == durable_data), so
    # that an fsync after an append copies the appended bytes, not the whole file.
    dirty_from: int | None = None
    entries: dict[str, Node] = field(default_factory=dict)   # dirs: current entries
    durable_entries: dict[str, Node] = field(default_factory=dict)  # at the last dir fsync
    nlink: int = 0                 # current entries naming it (plus . and .. for directories)
    opened: int = 0                # open handles
    mtime_ns: int = field(default_factory=time.time_ns)
    ctime_ns: int = field(default_factory=time.time_ns)


@dataclass(eq=False)
class Handle:
    node: Node
    append: bool = False


class Model:
    """The file system in memory: every operation takes a path or a handle and raises
    ``OSError`` with the errno a file system would answer. Not thread-safe: callers lock."""

    def __init__(self) -> None:
        self.next_ino = 2
        self.root = Node(1, True, stat.S_IFDIR | 0o755, "/", nlink=2)
        self.handles: dict[int, Handle] = {}
        # Open files unlinked by name, as libfuse addresses them until their last close.
        self.hidden: dict[str, Node] = {}
        self.next_fh = 1
        self.fsync_fails: tuple[bool, str | None] = (False, None)
        self.enospc = False
        self.counts = dict.fromkeys(("fsync", "fdatasync", "fsyncdir", "fsync_eio", "write",
                                     "write_bytes", "write_enospc", "crash"), 0)

    # paths and handles
    def lookup(self, path: str) -> Node:
        hidden = self.hidden.get(path)
        if hidden is not None:
            return hidden
        node = self.root
        for part in path.split("/"):
            if not part:
                continue
            if not node.is_dir:
                raise OSError(errno.ENOTDIR, path)
            child = node.entries.get(part)
            if child is None:
                raise OSError(errno.ENOENT, path)
            node = child
        return node

    def parent_of(self, path: str) -> tuple[Node, str]:
        head, _, name = path.rstrip("/").rpartition("/")
        parent = self.lookup(head)
        if not parent.is_dir:
            raise OSError(errno.ENOTDIR, path)
        return parent, name

    def node(self, path: str | None, fh: int | None) -> Node:
        if fh is not None and fh in self.handles:
            return self.handles[fh].node
        if path is None:
            raise OSError(errno.EBADF, "no path and no handle")
        return self.lookup(path)

    def open_handle(self, node: Node, append: bool = False) -> int:
        fh = self.next_fh
        self.next_fh += 1
        self.handles[fh] = Handle(node, append)
        node.opened += 1
        return fh

    def release(self, fh: int) -> None:
        handle = self.handles.pop(fh, None)
        if handle is not None:
            handle.node.opened -= 1

    # metadata
    def new_node(self, parent: Node, name: str, mode: int) -> Node:
        if name in parent.entries:
            raise OSError(errno.EEXIST, name)
        is_dir = stat.S_ISDIR(mode)
        node = Node(self.next_ino, is_dir, mode, name, nlink=2 if is_dir else 1)
        self.next_ino += 1
        parent.entries[name] = node
        if is_dir:
            parent.nlink += 1
        parent.mtime_ns = time.time_ns()
        return node

    def unlink(self, path: str) -> None:
        if self.hidden.pop(path, None) is not None:
            return
        parent, name = self.parent_of(path)
        node = parent.entries.get(name)
        if node is None:
            raise OSError(errno.ENOENT, path)
        if node.is_dir:
            raise OSError(errno.EISDIR, path)
        del parent.entries[name]
        node.nlink -= 1
        parent.mtime_ns = time.time_ns()

    def rmdir(self, path: str) -> None:
        parent, name = self.parent_of(path)
        node = parent.entries.get(name)
        if node is None:
            raise OSError(errno.ENOENT, path)
        if not node.is_dir:
            raise OSError(errno.ENOTDIR, path)
        if node.entries:
            raise OSError(errno.ENOTEMPTY, path)
        del parent.entries[name]
        node.nlink = 0
        parent.nlink -= 1
        parent.mtime_ns = time.time_ns()

    def rename(self, old: str, new: str) -> None:
        if new.rpartition("/")[2].startswith(".fuse_hidden"):
            node = self.lookup(old)
            self.unlink(old)
            self.hidden[new] = node
            return
        old_parent, old_name = self.parent_of(old)
        new_parent, new_name = self.parent_of(new)
        node = old_parent.entries.get(old_name)
        if node is None:
            raise OSError(errno.ENOENT, old)
        target = new_parent.entries.get(new_name)
        if target is node:
            return
        if target is not None:
            if node.is_dir and not target.is_dir:
                raise OSError(errno.ENOTDIR, new)
            if target.is_dir and not node.is_dir:
                raise OSError(errno.EISDIR, new)
            if target.is_dir:
                if target.entries:
                    raise OSError(errno.ENOTEMPTY, new)
                target.nlink = 0
                new_parent.nlink -= 1
            else:
                target.nlink -= 1
        del old_parent.entries[old_name]
        new_parent.entries[new_name] = node
        if node.is_dir:
            old_parent.nlink -= 1
            new_parent.nlink += 1
        node.name = new_name
        now = time.time_ns()
        old_parent.mtime_ns = new_parent.mtime_ns = node.ctime_ns = now

    def link(self, existing: str, new: str) -> None:
        node = self.lookup(existing)
        if node.is_dir:
            raise OSError(errno.EPERM, existing)
        parent, name = self.parent_of(new)
        if name in parent.entries:
            raise OSError(errno.EEXIST, new)
        parent.entries[name] = node
        node.nlink += 1

    # data
    def write(self, fh: int, data: bytes, offset: int) -> int:
        handle = self.handles[fh]
        if self.enospc:
            self.counts["write_enospc"] += 1
            raise OSError(errno.ENOSPC, handle.node.name)
        node = handle.node
        buf = node.data
        # O_APPEND is ours to honour: the kernel's idea of the size may predate a crash.
        if handle.append:
            offset = len(buf)
        self._dirty(node, min(offset, len(buf)))
        if offset > len(buf):
            buf.extend(bytes(offset - len(buf)))
        buf[offset:offset + len(data)] = data
        node.mtime_ns = time.time_ns()
        self.counts["write"] += 1
        self.counts["write_bytes"] += len(data)
        return len(data)

    def truncate(self, node: Node, length: int) -> None:
        if node.is_dir:
            raise OSError(errno.EISDIR, node.name)
        if length > len(node.data) and self.enospc:
            self.counts["write_enospc"] += 1
            raise OSError(errno.ENOSPC, node.name)
        self._dirty(node, min(length, len(node.data)))
        if length < len(node.data):
            del node.data[length:]
        else:
            node.data.extend(bytes(length - len(node.data)))
        node.mtime_ns = time.time_ns()

    @staticmethod
    def _dirty(node: Node, offset: int) -> None:
        if node.dirty_from is None or offset < node.dirty_from:
            node.dirty_from = offset

    @staticmethod
    def _make_durable(node: Node) -> None:
        if node.dirty_from is not None:
            node.durable_data[node.dirty_from:] = node.data[node.dirty_from:]
            node.dirty_from = None

    # durability
    def _fsync_refused(self, node: Node) -> bool:
        on, pattern = self.fsync_fails
        if on and (pattern is None or fnmatch.fnmatchcase(node.name, pattern)):
            self.counts["fsync_eio"] += 1
            return True
        return False

    def fsync(self, node: Node, datasync: bool) -> None:
        if node.is_dir:  # an fsync of a directory handle opened as a file
            self.fsyncdir(node)
            return
        self.counts["fdatasync" if datasync else "fsync"] += 1
        if self._fsync_refused(node):
            raise OSError(errno.EIO, node.name)
        self._make_durable(node)

    def fsyncdir(self, node: Node) -> None:
        self.counts["fsyncdir"] += 1
        if self._fsync_refused(node):
            raise OSError(errno.EIO, node.name)
        node.durable_entries = dict(node.entries)

    def sync(self) -> None:
        """Everything durable as it stands (what sync(2) would do)."""
        def walk(node: Node) -> None:
            if node.is_dir:
                node.durable_entries = dict(node.entries)
                for child in node.entries.values():
                    walk(child)
            else:
                self._make_durable(node)
        walk(self.root)

    def crash(self) -> None:
        """Every inode reachable through durable entries back to its durable copy; the rest
        is gone (handles still open on it keep their node, which nothing names)."""
        self.counts["crash"] += 1
        seen: set[int] = set()
        links: dict[int, int] = {}

        def walk(node: Node) -> None:
            links[node.ino] = links.get(node.ino, 0) + 1
            if node.ino in seen:
                return
            seen.add(node.ino)
            if node.is_dir:
                node.entries = dict(node.durable_entries)
                for name, child in node.entries.items():
                    child.name = name
                    walk(child)
            else:
                node.data = bytearray(node.durable_data)
                node.dirty_from = None
        walk(self.root)

        def relink(node: Node) -> None:
            if node.is_dir:
                node.nlink = 2 + sum(child.is_dir for child in node.entries.values())
                for child in node.entries.values():
                    relink(child)
            else:
                node.nlink = links[node.ino]
        relink(self.root)

    def attrs(self, node: Node) -> dict[str, Any]:
        size = 0 if node.is_dir else len(node.data)
        return {"st_ino": node.ino, "st_mode": node.mode, "st_nlink": max(node.nlink, 0),
                "st_size": size, "st_blocks": (size + 511) // 512, "st_blksize": 4096,
                "st_uid": 0, "st_gid": 0, "st_atime": node.mtime_ns,
                "st_mtime": node.mtime_ns, "st_ctime": node.ctime_ns}


def _operations(model: Model, lock: threading.Lock, mounted_event: threading.Event):
    import mfusepy

    def locked(method):
        @functools.wraps(method)  # mfusepy reads create's signature
        def call(self, *args):
            with lock:
                try:
                    return method(self, *args)
                except KeyError as exc:  # a handle the kernel no longer has
                    raise mfusepy.FuseOSError(errno.EBADF) from exc
        return call

    class Ops(mfusepy.Operations):
        use_ns = True

        def init_with_config(self, conn, config) -> None:
            # Nothing may be served from the kernel's caches after a crash.
            config.entry_timeout = 0.0
            config.negative_timeout = 0.0
            config.attr_timeout = 0.0
            config.direct_io = 1
            config.kernel_cache = 0
            config.auto_cache = 0
            # hard_remove stays off: with it libfuse cannot find an unlinked open file for a
            # GETATTR without a handle, which is what the kernel sends for fstat (ESTALE).
            config.use_ino = 1
            mounted_event.set()

        @locked
        def getattr(self, path, fh=None):
            return model.attrs(model.node(path, fh))

        @locked
        def readdir(self, path, fh):
            node = model.node(path, fh)
            # With use_ino the inode number given here is the one readdir(3) sees, and glibc
            # skips entries whose number is 0: give each its own.
            return [(".", {"st_ino": node.ino, "st_mode": node.mode}, 0),
                    ("..", {"st_ino": 1, "st_mode": stat.S_IFDIR}, 0),
                    *((name, {"st_ino": child.ino, "st_mode": child.mode}, 0)
                      for name, child in node.entries.items())]

        @locked
        def opendir(self, path):
            node = model.lookup(path)
            if not node.is_dir:
                raise OSError(errno.ENOTDIR, path)
            return model.open_handle(node)

        @locked
        def releasedir(self, path, fh):
            model.release(fh)
            return 0

        @locked
        def fsyncdir(self, path, datasync, fh):
            model.fsyncdir(model.node(path, fh))
            return 0

        @locked
        def mkdir(self, path, mode):
            parent, name = model.parent_of(path)
            model.new_node(parent, name, stat.S_IFDIR | (mode & 0o7777))
            return 0

        @locked
        def mknod(self, path, mode, dev):
            if not stat.S_ISREG(mode):
                raise OSError(errno.EPERM, path)
            parent, name = model.parent_of(path)
            model.new_node(parent, name, mode)
            return 0

        @locked
        def create(self, path, mode, flags):
            parent, name = model.parent_of(path)
            node = parent.entries.get(name)
            if node is None:
                node = model.new_node(parent, name, stat.S_IFREG | (mode & 0o7777))
            elif flags & os.O_EXCL:
                raise OSError(errno.EEXIST, path)
            elif flags & os.O_TRUNC:
                model.truncate(node, 0)
            return model.open_handle(node, bool(flags & os.O_APPEND))

        @locked
        def open(self, path, flags):
            node = model.lookup(path)
            if flags & os.O_TRUNC and flags & os.O_ACCMODE != os.O_RDONLY:
                model.truncate(node, 0)
            return model.open_handle(node, bool(flags & os.O_APPEND))

        @locked
        def read(self, path, size, offset, fh):
            return bytes(model.handles[fh].node.data[offset:offset + size])

        @locked
        def write(self, path, data, offset, fh):
            return model.write(fh, data, offset)

        @locked
        def truncate(self, path, length, fh=None):
            model.truncate(model.node(path, fh), length)
            return 0

        @locked
        def flush(self, path, fh):
            return 0

        @locked
        def release(self, path, fh):
            model.release(fh)
            return 0

        @locked
        def fsync(self, path, datasync, fh):
            model.fsync(model.node(path, fh), bool(datasync))
            return 0

        @locked
        def unlink(self, path):
            model.unlink(path)
            return 0

        @locked
        def rmdir(self, path):
            model.rmdir(path)
            return 0

        @locked
        def rename(self, old, new):
            model.rename(old, new)
            return 0

        @locked
        def link(self, target, source):
            model.link(source, target)
            return 0

        @locked
        def chmod(self, path, mode, fh=None):
            node = model.node(path, fh)
            node.mode = (node.mode & ~0o7777) | (mode & 0o7777)
            return 0

        @locked
        def chown(self, path, uid, gid):
            return 0

        @locked
        def utimens(self, path, times=None):
            if path is not None and times is not None:
                model.lookup(path).mtime_ns = int(times[1])
            return 0

        @locked
        def statfs(self, path):
            free = 0 if model.enospc else 1 << 20
            return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": 1 << 20, "f_bfree": free,
                    "f_bavail": free, "f_files": 1 << 20, "f_ffree": 1 << 20, "f_namemax": 255}

    class Fuse(mfusepy.FUSE):
        # mfusepy passes neither ftruncate's nor fchmod's handle on libfuse 3 (the path is
        # missing for an unlinked open file), nor rename's flags (RENAME_NOREPLACE/EXCHANGE,
        # which this file system refuses rather than ignores).
        def truncate_fuse_3(self, path, length, fip):
            fh = fip.contents.fh if fip else None
            return self.operations.truncate(None if path is None else path.decode(), length, fh)

        def chmod_fuse_3(self, path, mode, fip):
            fh = fip.contents.fh if fip else None
            return self.operations.chmod(None if path is None else path.decode(), mode, fh)

        def rename_fuse_3(self, old, new, flags):
            if flags:
                return -errno.EINVAL
            return self.rename_fuse_2(old, new)

    return Ops(), Fuse


def _control(model: Model, lock: threading.Lock, mounted_event: threading.Event,
             out: Any) -> None:
    """Serve requests from standard input; at its end, unmount (SIGTERM to ourselves)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
    mounted_event.wait()
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            op = request["op"]
            reply: dict[str, Any] = {"ok": True}
            with lock:
                if op == "crash":
                    model.crash()
                elif op == "sync":
                    model.sync()
                elif op == "fail_fsync":
                    model.fsync_fails = (bool(request["on"]), request.get("pattern"))
                elif op == "fail_write_enospc":
                    model.enospc = bool(request["on"])
                elif op == "counts":
                    reply["counts"] = dict(model.counts)
                else:
                    reply = {"ok": False, "error": f"unknown op {op!r}"}
        except Exception as exc:  # a bad request is answered, never the end of the mount
            reply = {"ok": False, "error": repr(exc)}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    os.kill(os.getpid(), signal.SIGTERM)


def serve(mountpoint: str) -> None:
    """The file system process: mount at ``mountpoint`` and serve until unmounted."""
    # Standard output is the control channel; libfuse and anything else print to stderr.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    model, lock, mounted_event = Model(), threading.Lock(), threading.Event()
    ops, fuse_class = _operations(model, lock, mounted_event)
    threading.Thread(target=_control, args=(model, lock, mounted_event, out), daemon=True,
                     name="control").start()
    options: dict[str, Any] = {"fsname": "lossyfs", "subtype": "lossyfs"}
    if os.geteuid() == 0:
        options["allow_other"] = True  # brokers under test may run as another user
    # One thread: the model is one lock anyway, and the kernel keeps flocks itself.
    try:
        fuse_class(ops, mountpoint, foreground=True, nothreads=True, **options)
    except RuntimeError as exc:
        # fuse_main answers 8 when a signal (our SIGTERM) ended its loop: a clean unmount.
        if exc.args != (8,):
            raise


# --- the test's side -----------------------------------------------------------------------

class LossyFS:
    """A LossyFS process and its mount, driven over its control channel (see the module)."""

    def __init__(self, mountpoint: Path, log_path: Path | None = None) -> None:
        self.mountpoint = Path(mountpoint)
        self.log_path = log_path or self.mountpoint.with_name(self.mountpoint.name + ".log")
        self.proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def start(self, timeout: float = 20.0) -> LossyFS:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, __file__, str(self.mountpoint)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log)
        try:
            line = self._read_line(timeout)
            if json.loads(line) != {"ready": True}:
                raise RuntimeError(f"lossyfs: unexpected first line {line!r}")
        except BaseException:
            self.stop()
            raise
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _read_line(self, timeout: float) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline().decode() if ready else ""
        if not line:
            state = "exited" if self.proc.poll() is not None else "did not answer"
            raise RuntimeError(f"lossyfs at {self.mountpoint} {state}:\n{self.log()}")
        return line

    def _request(self, op: str, **args: Any) -> dict[str, Any]:
        with self._lock:
            if self.proc is None or self.proc.stdin is None:
                raise RuntimeError("lossyfs is not running")
            self.proc.stdin.write((json.dumps({"op": op, **args}) + "\n").encode())
            self.proc.stdin.flush()
            reply = json.loads(self._read_line(30))
        if not reply.get("ok"):
            raise RuntimeError(f"lossyfs {op}: {reply.get('error')}")
        return reply

    def crash(self) -> None:
        """Drop every change not made durable, at once; the mount keeps serving."""
        self._request("crash")

    def sync(self) -> None:
        """Make everything durable as it stands (a starting state a crash returns to)."""
        self._request("sync")

    def fail_fsync(self, on: bool, pattern: str | None = None) -> None:
        """fsync, fdatasync and directory fsyncs answer EIO while ``on``: for every name, or
        for files and directories whose name matches the glob ``pattern``."""
        self._request("fail_fsync", on=on, pattern=pattern)

    def fail_write_enospc(self, on: bool) -> None:
        """Writes, and truncates that grow a file, answer ENOSPC while ``on``."""
        self._request("fail_write_enospc", on=on)

    def counts(self) -> dict[str, int]:
        """Operations served since the mount: fsync, fdatasync, fsyncdir (directory fsyncs),
        fsync_eio (of those, answered EIO), write, write_bytes, write_enospc, crash."""
        return self._request("counts")["counts"]

    def stop(self) -> None:
        """Unmount and end the process, however far it got; safe to call twice."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()  # libfuse ends its loop and unmounts
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    _unmount(self.mountpoint)
                    proc.kill()
                    proc.wait(10)
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
        if os.path.ismount(self.mountpoint):
            _unmount(self.mountpoint)

    def __enter__(self) -> LossyFS:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _unmount(mountpoint: Path) -> None:
    """Detach a mount whose process is gone or stuck (a lazy unmount: open files may stay)."""
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    command = [tool, "-u", "-z", str(mountpoint)] if tool else ["umount", "-l", str(mountpoint)]
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


@contextlib.contextmanager
def mounted(mountpoint: Path) -> Iterator[LossyFS]:
    """A LossyFS mounted at ``mountpoint`` for the ``with`` block, unmounted after it even
    when the block fails."""
    fs = LossyFS(mountpoint)
    try:
        yield fs.start()
    finally:
        fs.stop()


if __name__ == "__main__":
    serve(sys.argv[1])
