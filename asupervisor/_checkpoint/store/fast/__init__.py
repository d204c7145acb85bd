"""The fast local store's machinery (Linux): :mod:`._bundle` (the tensor-bundle writer),
:mod:`._direct` (direct I/O for data files), :mod:`._idle_io` (a save's kernel work at idle
priority), :mod:`._direct_restore` and :mod:`._index` (the restore that reads and checks
the values itself). Each mechanism has its switch in :class:`..._options.FastPath`; only
:class:`._store.FastStore` and the modules it calls use them.

Optional code: nothing outside this package imports it when it is itself imported (a
function does, once the fast store is chosen); without it
(:func:`.._options.fast_store_available`), ``"auto"`` is the plain store."""
