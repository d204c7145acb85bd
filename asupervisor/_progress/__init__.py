"""Progress: a live display of a session's progress (``Supervisor(progress=True)``).

A feature: imports ``_core`` and the leaves, never another feature.
"""
