"""Summaries: the event-file writer, the summary service and the steps/sec counter.

A feature: imports ``_core`` and the leaves, never another feature.
"""
