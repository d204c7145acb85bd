"""The snapshot, on the step thread at a step boundary: the consistent copy of the state,
the reused object-graph walk, the ``tf.data`` iterator a checkpoint holds, the metrics it
records."""
