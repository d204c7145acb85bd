"""The plain store (:class:`._store.PlainStore`): TF's ``SaveV2`` in pieces
(:mod:`._write`), TF's restore checked value by value (:mod:`._restore`), the rename +
fsync commit of :mod:`.._commit`. Portable; imports nothing of ``fast/``, ``memory/`` or
``remote/`` (the fast store builds on it, not the other way round)."""
