"""Small files replaced atomically: a reader or a crash sees the old text or the new, never
a torn one.

:func:`replace_file` is the one way the package rewrites a small file in place (the RAM
tier's pointer, the remote owner id, the goodput ledger): the text goes to a temporary
file beside it, which is renamed over the old one; ``durable=True`` also fsyncs the
temporary file before the rename and the directory after it, so the new text survives a
power loss. Plain file work: never on the event loop thread.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["replace_file"]


def replace_file(path: Path, text: str, *, durable: bool = False) -> None:
    """Replace the small file ``path`` with ``text`` atomically (see the module docstring).

    Raises:
        OSError: the file or its temporary could not be written (the temporary removed).
    """
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
