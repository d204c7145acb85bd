"""Checkpoint stores: where every checkpoint byte and state-file update goes.

:mod:`._options` decides once per logdir which store it gets (``checkpoint_store``:
``"auto"``, ``"fast"``, ``"plain"``) as a frozen :class:`~._options.FastPath`;
:mod:`._local` holds the two local stores behind one interface, the plain one
(TensorFlow's ``SaveV2``/``RestoreV2``, portable file calls) and the fast Linux one.
Nothing outside this package asks which store it runs on.
"""
