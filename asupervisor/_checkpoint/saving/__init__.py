"""Saving: threads and waits. :mod:`._saver` (``CheckpointSaver``: the writer thread, the
busy rule, retries; ``CheckpointService``: the timers) and :mod:`._multi_worker` (a
non-chief's save to a temporary directory). Above ``policy/`` (which decides when and what
to keep, and imports nothing above it) and ``snapshot/``; writes through ``store/``'s door."""
