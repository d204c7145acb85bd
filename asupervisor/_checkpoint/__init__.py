"""Checkpoints: when to save, snapshots, the write and commit protocol, restore, retention.

A feature: imports ``_core`` and the leaves, never another feature.
"""
