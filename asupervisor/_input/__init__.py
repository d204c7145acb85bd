"""Input: queue runners feeding the step thread through a bounded queue.

A feature: imports ``_core`` and the leaves, never another feature.
"""
