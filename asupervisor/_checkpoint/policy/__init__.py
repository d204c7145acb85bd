"""When to save and what to keep: the save and keep policies, the checkpoint service and
its triggers (event loop), the cluster's agreed stop, multi-worker saving rules."""
