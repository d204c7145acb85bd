"""What of a file is in the page cache (``mincore``), and dropping it (``posix_fadvise``): for
the read-ahead and direct-I/O tests. Linux (and other systems with ``posix_fadvise``)."""

from __future__ import annotations

import ctypes
import mmap
import os


def resident_pages(path: str) -> list[bool]:
    """Whether each of ``path``'s pages is in the page cache (``mincore`` on a private
    mapping, which reports the file's cached pages and changes nothing)."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = os.path.getsize(path)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mm:
        anchor = ctypes.c_char.from_buffer(mm)
        try:
            if libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore({path})")
        finally:
            del anchor  # the mapping cannot close while exported
    return [bool(v & 1) for v in vec]


def resident_share(path: str) -> float:
    """The share of ``path``'s pages in the page cache."""
    pages = resident_pages(path)
    return sum(pages) / len(pages)


def drop_cached(paths: list[str]) -> None:
    """Ask the kernel to drop the files' pages from the page cache (clean pages do go)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
