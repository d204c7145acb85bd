"""A slow disk for the field tests: a FUSE file system, served by this module in a child
process, that passes everything through to a backing directory and writes no faster than
a given rate. A save on it takes at least ``bytes / rate`` seconds on any machine, so a
test of what a stop's grace does to a save in flight does not depend on how fast this
machine's real disk is.

    python slowdisk.py BACKING MOUNTPOINT MB_PER_SEC

mounts, prints ``READY``, serves until the mount goes away (``umount``) or the process
is terminated. The kernel's FUSE protocol is spoken directly over ``/dev/fuse`` (no
libfuse): the operations a training run uses (create, write, read, fsync, rename,
unlink, directories, statfs); the others answer ``ENOSYS``, as the protocol allows. An
empty file ``asv-stall-<secs>`` created in the mount's root makes the next write of a
checkpoint file hang that long (a write stuck in a hung disk); ``asv-slowread-<secs>``
makes the next read of a checkpoint's data file (``*.data-*``) hang that long (a restore
held by the disk).
Needs root (``mount``) and ``/dev/fuse``. :func:`mounted` is the context manager the
tests use.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import stat
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from _timing import scaled

MAX_WRITE = 128 << 10
#: ``<mount>/asv-stall-<secs>``: the next write of a ``*.ckpt*`` file stalls ``secs``
#: (:meth:`_Server.stall_once`)
STALL_PREFIX = "asv-stall-"
#: ``<mount>/asv-slowread-<secs>``: the next read of a ``*.data-*`` file stalls ``secs``
READ_STALL_PREFIX = "asv-slowread-"
_IN = struct.Struct("<IIQQIIII")  # len, opcode, unique, nodeid, uid, gid, pid, padding
_OUT = struct.Struct("<IiQ")  # len, error, unique
_ATTR = struct.Struct(
    "<QQQQQQIIIIIIIIII"
)  # ino size blocks atime mtime ctime *nsec mode nlink uid gid rdev blksize flags
_NAME_MAX = 255

# opcodes
LOOKUP, FORGET, GETATTR, SETATTR = 1, 2, 3, 4
MKDIR, UNLINK, RMDIR, RENAME = 9, 10, 11, 12
OPEN, READ, WRITE, STATFS, RELEASE, FSYNC = 14, 15, 16, 17, 18, 20
FLUSH, INIT, OPENDIR, READDIR, RELEASEDIR, FSYNCDIR = 25, 26, 27, 28, 29, 30
ACCESS, CREATE, INTERRUPT, DESTROY, BATCH_FORGET, FALLOCATE, RENAME2 = 34, 35, 36, 38, 42, 43, 45
_NO_REPLY = {FORGET, BATCH_FORGET, INTERRUPT}

# setattr's valid bits
_FATTR_MODE, _FATTR_SIZE, _FATTR_ATIME, _FATTR_MTIME = 1, 8, 16, 32


@functools.cache
def available() -> bool:
    """Whether this process can mount a FUSE file system: root, ``/dev/fuse``, and a
    mount that works (tried once, on an empty directory, and taken down again; a
    container may have the device but not the right to mount)."""
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        return False
    probe = tempfile.mkdtemp(prefix="asv-fuse-probe-")
    fd = os.open("/dev/fuse", os.O_RDWR)
    try:
        _mount(probe, fd)
    except OSError:
        return False
    finally:
        subprocess.run(["umount", "-l", probe], capture_output=True)
        os.close(fd)
        os.rmdir(probe)
    return True


@contextlib.contextmanager
def mounted(backing: Path, mountpoint: Path, mb_per_sec: float) -> Iterator[Path]:
    """Serve ``backing`` at ``mountpoint``, writing at most ``mb_per_sec`` MB/s, for the
    block; unmounted (and the server stopped) after it."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, __file__, str(backing), str(mountpoint), str(mb_per_sec)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != "READY":
            raise RuntimeError(f"the slow disk did not mount (it said {line!r}, exit {proc.poll()})")
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)
        proc.terminate()
        proc.wait(timeout=scaled(30))
        if proc.stdout is not None:
            proc.stdout.close()


class _Server:
    def __init__(self, backing: str, fd: int, bytes_per_sec: float) -> None:
        self.fd = fd
        self.bytes_per_sec = bytes_per_sec
        self.paths: dict[int, str] = {1: backing}  # nodeid -> backing path
        self.dirs: dict[int, list[tuple[str, int, int]]] = {}  # opendir handle -> entries
        self.next_dir = 1

    # -- replies -------------------------------------------------------------------

    def reply(self, unique: int, payload: bytes = b"", error: int = 0) -> None:
        with contextlib.suppress(OSError):  # an interrupted request: the kernel forgot it
            os.write(self.fd, _OUT.pack(_OUT.size + len(payload), -error, unique) + payload)

    def attr(self, st: os.stat_result, nodeid: int) -> bytes:
        return _ATTR.pack(
            nodeid, st.st_size, st.st_blocks, int(st.st_atime), int(st.st_mtime), int(st.st_ctime),
            st.st_atime_ns % 10**9, st.st_mtime_ns % 10**9, st.st_ctime_ns % 10**9,
            st.st_mode, st.st_nlink, st.st_uid, st.st_gid, st.st_rdev, 4096, 0,
        )  # fmt: skip

    def entry(self, path: str) -> bytes:
        st = os.lstat(path)
        nodeid = st.st_ino if path != self.paths[1] else 1
        self.paths[nodeid] = path
        # nodeid, generation, entry_valid, attr_valid (s), their nsec: entries cached 1 s, attributes not
        return struct.pack("<QQQQII", nodeid, 0, 1, 0, 0, 0) + self.attr(st, nodeid)

    def attr_out(self, path: str, nodeid: int) -> bytes:
        return struct.pack("<QII", 0, 0, 0) + self.attr(os.lstat(path), nodeid)

    # -- the loop ------------------------------------------------------------------

    def serve(self) -> None:
        while True:
            try:
                req = os.read(self.fd, MAX_WRITE + 4096)
            except OSError as exc:
                if exc.errno in (errno.EINTR, errno.EAGAIN, errno.ENOENT):
                    continue
                if exc.errno == errno.ENODEV:  # unmounted
                    return
                raise
            _len, opcode, unique, nodeid, _uid, _gid, _pid, _pad = _IN.unpack_from(req)
            body = req[_IN.size :]
            if opcode in _NO_REPLY:
                continue
            try:
                payload = self.handle(opcode, nodeid, body)
            except OSError as exc:
                self.reply(unique, error=exc.errno or errno.EIO)
            except NotImplementedError:
                self.reply(unique, error=errno.ENOSYS)
            else:
                self.reply(unique, payload)
            if opcode == DESTROY:
                return

    def stall_once(self, fh: int) -> None:
        """A write stuck in the disk: when the mount's root holds ``asv-stall-<secs>`` (an
        empty file the test creates) and ``fh`` is a checkpoint's file (not the
        watchdog's or the goodput ledger's, whose writes may come first), this write waits
        that long (the marker removed first, so one write stalls), and so does every
        request behind it, as on a hung network disk."""
        if ".ckpt" not in os.readlink(f"/proc/self/fd/{fh}"):
            return
        root = self.paths[1]
        for name in os.listdir(root):
            if name.startswith(STALL_PREFIX):
                os.unlink(os.path.join(root, name))
                time.sleep(float(name[len(STALL_PREFIX) :]))
                return

    def stall_read_once(self, fh: int) -> None:
        """A read stuck in the disk: when the mount's root holds ``asv-slowread-<secs>``
        and ``fh`` is a checkpoint's data file, this read waits that long (the marker
        removed first), and so does every request behind it."""
        if ".data-" not in os.readlink(f"/proc/self/fd/{fh}"):
            return
        root = self.paths[1]
        for name in os.listdir(root):
            if name.startswith(READ_STALL_PREFIX):
                os.unlink(os.path.join(root, name))
                time.sleep(float(name[len(READ_STALL_PREFIX) :]))
                return

    def child(self, nodeid: int, body: bytes, offset: int = 0) -> str:
        name = body[offset:].split(b"\0", 1)[0].decode()
        return os.path.join(self.paths[nodeid], name)

    def handle(self, opcode: int, nodeid: int, body: bytes) -> bytes:
        path = self.paths.get(nodeid, "")
        if opcode == INIT:
            major, minor, readahead, _flags = struct.unpack_from("<IIII", body)
            if major != 7:
                raise OSError(errno.EPROTO, "FUSE major version")
            big_writes = 1 << 5
            # major, minor, max_readahead, flags, max_background, congestion_threshold, max_write,
            # time_gran, max_pages, map_alignment, flags2, max_stack_depth, unused[6]
            return struct.pack(
                "<IIIIHHIIHHII24x", 7, min(minor, 31), readahead, big_writes, 16, 12, MAX_WRITE, 1, 0, 0, 0, 0
            )
        if opcode == DESTROY:
            return b""
        if opcode == LOOKUP:
            return self.entry(self.child(nodeid, body))
        if opcode == GETATTR:
            return self.attr_out(path, nodeid)
        if opcode == SETATTR:
            valid, _pad, fh, size, _owner, atime, mtime, _ctime, atimensec, mtimensec, _cn, mode = struct.unpack_from(
                "<IIQQQQQQIIII", body
            )
            if valid & _FATTR_SIZE:
                os.truncate(path, size)
            if valid & _FATTR_MODE:
                os.chmod(path, stat.S_IMODE(mode))
            if valid & (_FATTR_ATIME | _FATTR_MTIME):
                os.utime(path, ns=(atime * 10**9 + atimensec, mtime * 10**9 + mtimensec))
            return self.attr_out(path, nodeid)
        if opcode == MKDIR:
            mode, _umask = struct.unpack_from("<II", body)
            target = self.child(nodeid, body, 8)
            os.mkdir(target, stat.S_IMODE(mode))
            return self.entry(target)
        if opcode == UNLINK:
            os.unlink(self.child(nodeid, body))
            return b""
        if opcode == RMDIR:
            os.rmdir(self.child(nodeid, body))
            return b""
        if opcode in (RENAME, RENAME2):
            (newdir,) = struct.unpack_from("<Q", body)
            offset = 8 if opcode == RENAME else 16
            if opcode == RENAME2 and struct.unpack_from("<I", body, 8)[0]:
                raise OSError(errno.EINVAL, "rename flags")
            old, new = body[offset:].split(b"\0")[:2]
            src, dst = os.path.join(path, old.decode()), os.path.join(self.paths[newdir], new.decode())
            os.rename(src, dst)
            for known, where in list(self.paths.items()):  # the node and what is under it moved
                if where == src or where.startswith(src + "/"):
                    self.paths[known] = dst + where[len(src) :]
            return b""
        if opcode in (OPEN, CREATE):
            flags = struct.unpack_from("<I", body)[0] & ~os.O_DIRECT & ~os.O_NOATIME
            if opcode == OPEN:
                fh = os.open(path, flags)
                return struct.pack("<QII", fh, 0, 0)
            mode = struct.unpack_from("<I", body, 4)[0]
            target = self.child(nodeid, body, 16)
            fh = os.open(target, flags | os.O_CREAT, stat.S_IMODE(mode))
            return self.entry(target) + struct.pack("<QII", fh, 0, 0)
        if opcode == READ:
            fh, offset, size = struct.unpack_from("<QQI", body)
            self.stall_read_once(fh)
            return os.pread(fh, size, offset)
        if opcode == WRITE:
            fh, offset, size = struct.unpack_from("<QQI", body)
            self.stall_once(fh)
            t0 = time.monotonic()
            written = os.pwrite(fh, body[40 : 40 + size], offset)
            time.sleep(max(0.0, written / self.bytes_per_sec - (time.monotonic() - t0)))  # the disk's rate
            return struct.pack("<II", written, 0)
        if opcode == FALLOCATE:
            fh, offset, length, mode = struct.unpack_from("<QQQI", body)
            if mode:
                raise NotImplementedError
            os.posix_fallocate(fh, offset, length)
            return b""
        if opcode == STATFS:
            s = os.statvfs(path)
            return struct.pack(
                "<QQQQQIIII24x", s.f_blocks, s.f_bfree, s.f_bavail, s.f_files, s.f_ffree,
                s.f_bsize, min(s.f_namemax, _NAME_MAX), s.f_frsize, 0,
            )  # fmt: skip
        if opcode == RELEASE:
            os.close(struct.unpack_from("<Q", body)[0])
            return b""
        if opcode in (FSYNC, FLUSH, FSYNCDIR):
            if opcode == FSYNC:
                os.fsync(struct.unpack_from("<Q", body)[0])
            return b""
        if opcode == ACCESS:
            return b""
        if opcode == OPENDIR:
            handle = self.next_dir
            self.next_dir += 1
            entries = [(".", nodeid, stat.S_IFDIR), ("..", 1, stat.S_IFDIR)]
            with os.scandir(path) as it:
                for e in it:
                    st = e.stat(follow_symlinks=False)
                    entries.append((e.name, st.st_ino, stat.S_IFMT(st.st_mode)))
            self.dirs[handle] = entries
            return struct.pack("<QII", handle, 0, 0)
        if opcode == READDIR:
            handle, offset, size = struct.unpack_from("<QQI", body)
            out = b""
            for index, (name, ino, kind) in enumerate(self.dirs.get(handle, [])[offset:], start=offset + 1):
                raw = name.encode()
                rec = struct.pack("<QQII", ino, index, len(raw), kind >> 12) + raw
                rec += b"\0" * (-len(rec) % 8)
                if len(out) + len(rec) > size:
                    break
                out += rec
            return out
        if opcode == RELEASEDIR:
            self.dirs.pop(struct.unpack_from("<Q", body)[0], None)
            return b""
        raise NotImplementedError


def _mount(mountpoint: str, fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    options = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
    if libc.mount(b"slowdisk", mountpoint.encode(), b"fuse.slowdisk", 0, options) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {mountpoint}: {os.strerror(err)}")


def main() -> None:
    backing, mountpoint, mb_per_sec = sys.argv[1], sys.argv[2], float(sys.argv[3])
    fd = os.open("/dev/fuse", os.O_RDWR)
    _mount(mountpoint, fd)
    print("READY", flush=True)
    _Server(os.path.realpath(backing), fd, mb_per_sec * 1e6).serve()


if __name__ == "__main__":
    main()
