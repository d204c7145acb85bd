"""A small tmpfs mounted for a test (a file system that fills up): root only.

``CAN_MOUNT`` says whether this machine allows it (root, ``mount``, a kernel that lets
this process mount); ``needs_mount`` skips a test where it does not, naming why;
:func:`mounted` mounts one of ``size`` (``"6m"``) at ``target`` for a ``with`` block.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _can_mount() -> bool:
    if not IS_ROOT or not shutil.which("mount"):
        return False
    target = tempfile.mkdtemp(prefix="asv-mount-probe-")
    try:
        ok = (
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", target], capture_output=True).returncode
            == 0
        )
        if ok:
            subprocess.run(["umount", target], capture_output=True)
        return ok
    finally:
        os.rmdir(target)


CAN_MOUNT = _can_mount()
needs_mount = pytest.mark.skipif(not CAN_MOUNT, reason="mounting a tmpfs needs root and a kernel that allows it here")


@contextlib.contextmanager
def mounted(target: Path, size: str = "6m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``target`` (made if missing), unmounted after."""
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(target)], check=True)
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)
