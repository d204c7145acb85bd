"""Plain file work of checkpoints: names, the state file, commits, writeback, retention."""
