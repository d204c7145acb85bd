"""The RAM tier (:class:`._tier.MemoryTier`): checkpoints in memory that outlives the
process (``/dev/shm`` on Linux), below the disk. Optional code, opened by the chooser
(:func:`.._choose.open_memory_tier`) when ``CheckpointOptions(ram_tier=...)`` asks for it;
it imports only the modules every store shares."""
