"""The stock hooks (``tf.train`` parity) and ``SecondOrStepTimer``.

A feature: imports ``_core`` and the leaves, never another feature.
"""
