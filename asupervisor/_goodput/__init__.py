"""The goodput ledger: where a run's time went, across its restarts (``docs/goodput.md``).

A feature: imports ``_core`` and the leaves, never another feature.
"""
