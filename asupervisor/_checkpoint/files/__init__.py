"""Plain file work of checkpoints, split by guarantee: :mod:`._names` (what the files are
called, nothing written), :mod:`._state_file` (the `checkpoint` file, replaced atomically),
:mod:`._writeback` (bytes to disk: fsync, early writeback), :mod:`._commit` (a checkpoint
appears whole or not at all; removal; retention)."""
