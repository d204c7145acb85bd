"""Object storage as the second tier of a logdir (``s3://``, ``gs://``, any fsspec URL).

A URL logdir trains into a local working directory exactly as a local logdir does (the
local store commits every checkpoint); :class:`._tier.RemoteTier` copies committed
checkpoints to the URL beside the step loop and brings the newest one back on a fresh
machine. :mod:`._layout` is what the remote holds (objects, commit markers, the state
object) and how a reader tells a committed checkpoint; :mod:`._lease` is the owner's
lease. See ``docs/storage.md``.

Optional code: nothing outside this package imports it when it is itself imported (a
function does, for a URL logdir); :mod:`.._url`, outside it, checks URLs at construction
and says when it is missing.
"""
