"""Checkpoint stores: where every checkpoint byte and state-file update goes.

:mod:`._options` decides once per logdir which store it gets (``checkpoint_store``:
``"auto"``, ``"fast"``, ``"plain"``) as a frozen :class:`~._options.FastPath`;
:mod:`._local` holds the two local stores behind one interface, the plain one
(TensorFlow's ``SaveV2``/``RestoreV2``, portable file calls) and the fast Linux one, whose
machinery is in :mod:`.fast`. What both share, split by guarantee: :mod:`._names` (what
the files are called, nothing written), :mod:`._state_file` (the ``checkpoint`` file,
replaced atomically), :mod:`._writeback` (bytes and directories to disk),
:mod:`._commit` (a checkpoint appears whole or not at all; removal; retention),
:mod:`._candidates` (which checkpoints a restore tries, in order),
:mod:`._owner` (one training per logdir). Nothing outside this package asks which store
it runs on.
"""
