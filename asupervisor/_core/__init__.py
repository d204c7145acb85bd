"""The engine: threads, stop, services, hooks, parts, the step loop, the session lifetime.

``_core`` imports the leaves (``_exceptions``, ``_tf``, ``_cluster``, ``_logging``) and
itself, never a feature package: features plug in through :mod:`._abc`.
"""
