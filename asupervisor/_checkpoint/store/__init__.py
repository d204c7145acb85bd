"""Checkpoint stores: where every checkpoint byte and state-file update goes. This
package's ``__init__`` is its only door: nothing outside ``store/`` imports its modules
(``tests/test_layers.py`` checks it), only the names below.

:mod:`._options` decides once per logdir which store it gets (``checkpoint_store``:
``"auto"``, ``"fast"``, ``"plain"``) as a frozen :class:`~._options.FastPath`;
:mod:`._local` holds the two local stores behind one interface, the plain one
(TensorFlow's ``SaveV2``/``RestoreV2``, portable file calls; :mod:`._write`,
:mod:`._restore`) and the fast Linux one, whose machinery is in :mod:`.fast`. What both
share, split by guarantee: :mod:`._names` (what the files are called, nothing written),
:mod:`._state_file` (the ``checkpoint`` file, replaced atomically), :mod:`._writeback`
(bytes and directories to disk), :mod:`._commit` (a checkpoint appears whole or not at
all; removal; retention), :mod:`._candidates` (which checkpoints a restore tries, in
order), :mod:`._owner` (one training per logdir), :mod:`._url` (which logdirs are URLs).

:mod:`.fast` and :mod:`.remote` are optional code: this door reaches them only inside
functions (:func:`idle_io`, :func:`native_writer_checked`, :func:`open_remote_tier`,
:func:`open_remote_fs`, :func:`inspect_remote`), once their store is chosen.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..snapshot import _iterator_state, _snapshot
from . import _candidates as candidates
from . import _commit as commit
from . import _names as names
from . import _restore as restore
from . import _state_file as state_file
from . import _write as write
from . import _writeback as writeback
from ._local import PlainStore, open_store
from ._options import (
    ENV_VAR,
    PLAIN,
    STORE_KINDS,
    FastPath,
    check_store_kind,
    fast_store_available,
    load_fast,
    resolve_store,
)
from ._owner import OWNER_FILE, OwnerLock
from ._url import check_not_mistyped, check_url, default_local_dir, is_url

if TYPE_CHECKING:
    from collections.abc import Callable

    from .fast._idle_io import IdleIO
    from .remote._io import RemoteFS
    from .remote._tier import RemoteTier, Uploaded

__all__ = [
    "ENV_VAR",
    "OWNER_FILE",
    "PLAIN",
    "STORE_KINDS",
    "FastPath",
    "IdleIO",
    "OwnerLock",
    "PlainStore",
    "RemoteFS",
    "RemoteTier",
    "Uploaded",
    "candidates",
    "check_not_mistyped",
    "check_store_kind",
    "check_url",
    "commit",
    "default_local_dir",
    "fast_store_available",
    "idle_io",
    "inspect_remote",
    "is_url",
    "names",
    "native_writer_checked",
    "open_remote_fs",
    "open_remote_tier",
    "open_store",
    "resolve_store",
    "restore",
    "state_file",
    "write",
    "writeback",
]

# The snapshot's staging buffers and the index reader are the fast store's: the snapshot
# asks for them through these hooks (it imports nothing of the store), loaded on first use.
_snapshot.load_staging = load_fast
_iterator_state.load_index_reader = load_fast


def idle_io(submit: Callable[..., Any]) -> IdleIO:
    """The fast store's idle-priority I/O runner over ``submit`` (a thread's)."""
    from .fast._idle_io import IdleIO

    return IdleIO(submit)


def native_writer_checked() -> bool:
    """Whether the fast store's native writer has proven itself (staging may be used)."""
    from .fast import _bundle

    return bool(_bundle.checked())


def open_remote_tier(url: str, local_dir: Path, **kwargs: Any) -> RemoteTier:
    """The remote tier of the URL logdir ``url`` (:class:`.remote._tier.RemoteTier`)."""
    from .remote._tier import RemoteTier

    return RemoteTier(url, local_dir, **kwargs)


def open_remote_fs(url: str) -> RemoteFS:
    """The bounded file system of ``url`` (:class:`.remote._io.RemoteFS`)."""
    from .remote._io import RemoteFS

    return RemoteFS(url)


def inspect_remote(url: str) -> dict[str, Any]:
    """``asupervisor inspect`` of a URL logdir (:func:`.remote._report.inspect_remote`)."""
    from .remote._report import inspect_remote as report

    return report(url)
