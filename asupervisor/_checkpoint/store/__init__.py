"""Checkpoint stores: where every checkpoint byte and state-file update goes. This
package's ``__init__`` is its only door: nothing outside ``store/`` imports its modules
(``tests/test_layers.py`` checks it), only the names below.

:class:`CheckpointStore` (:mod:`._types`) is the protocol every store implements;
:func:`open_store` (:mod:`._choose`, the only module that imports an implementation,
inside a function) gives a directory its store once: ``plain/`` (TF's ``SaveV2`` and
restore, portable), ``fast/`` (the Linux fast path) or ``memory/`` (the RAM tier). What
every store shares, split by guarantee: :mod:`._names` (what the files are called,
nothing written), :mod:`._state_file` (the ``checkpoint`` file, replaced atomically; the
only module that writes it or edits what a state names), :mod:`._writeback` (bytes and directories to disk),
:mod:`._commit` (a checkpoint appears whole or not at all; removal), :mod:`._retention`
(what a keep policy drops, for every store: the only place one is applied),
:mod:`._candidates` (which checkpoints a restore tries, in
order), :mod:`._owner` (one training per logdir), :mod:`._url` (which logdirs are URLs).

``fast/``, ``memory/`` and ``remote/`` are optional code, reached only through the
chooser's functions once their store is chosen (:func:`open_tiered_store`: a URL
logdir's store, the local one then object storage; :func:`open_remote_tier`,
:func:`open_remote_fs`, :func:`inspect_remote`, :func:`open_memory_tier`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..snapshot import _iterator_state, _snapshot
from . import _candidates as candidates
from . import _commit as commit
from . import _names as names
from . import _retention as retention
from . import _state_file as state_file
from . import _writeback as writeback
from ._choose import (
    check_url,
    fast_store_available,
    inspect_ram_tier,
    inspect_remote,
    load_fast,
    open_memory_tier,
    open_remote_fs,
    open_remote_tier,
    open_store,
    open_tiered_store,
    ram_tier_root,
    resolve_store,
    restore_latest,
    restore_path,
)
from ._errors import SaveAbandoned, write_error
from ._options import ENV_VAR, PLAIN, STORE_KINDS, FastPath, check_store_kind
from ._owner import OWNER_FILE, OwnerLock
from ._types import CheckpointStore, IdleIO, RestoreOutcome, Written
from ._url import check_not_mistyped, default_local_dir, is_url

if TYPE_CHECKING:
    from .memory._tier import MemoryTier
    from .remote._io import RemoteFS
    from .remote._store import TieredStore
    from .remote._tier import RemoteTier, Uploaded

__all__ = [
    "ENV_VAR",
    "OWNER_FILE",
    "PLAIN",
    "STORE_KINDS",
    "CheckpointStore",
    "FastPath",
    "IdleIO",
    "MemoryTier",
    "OwnerLock",
    "RemoteFS",
    "RemoteTier",
    "RestoreOutcome",
    "SaveAbandoned",
    "TieredStore",
    "Uploaded",
    "Written",
    "candidates",
    "check_not_mistyped",
    "check_store_kind",
    "check_url",
    "commit",
    "default_local_dir",
    "fast_store_available",
    "inspect_ram_tier",
    "inspect_remote",
    "is_url",
    "load_fast",
    "names",
    "open_memory_tier",
    "open_remote_fs",
    "open_remote_tier",
    "open_store",
    "open_tiered_store",
    "ram_tier_root",
    "resolve_store",
    "restore_latest",
    "restore_path",
    "retention",
    "state_file",
    "write_error",
    "writeback",
]

# The snapshot's staging buffers and the index reader are the fast store's: the snapshot
# asks for them through these hooks (it imports nothing of the store), loaded on first use.
_snapshot.load_staging = load_fast
_iterator_state.load_index_reader = load_fast
