"""When to save and what to keep: the save and keep policies, the session's cadence (the one
place they are asked), the saver and the checkpoint service (event loop and step trigger),
the cluster's agreed stop, multi-worker saving rules."""
