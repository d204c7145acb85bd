"""A training with the RAM tier on, which can SIGKILL itself once the tier holds a step.

Usage: ``ram_tier_train.py LOGDIR RAM_ROOT MAX_STEPS [KILL_AT]``. ``w`` starts at zeros
and each step adds one, so its value is the step it was saved at. Disk saves are an hour
apart (the start-up save and the final one only); RAM saves every 0.05 s. Prints
``started <step> <w's value> <tier the restore came from>``; with ``KILL_AT``, from that
step on, the first step that finds the RAM tier holding a step >= ``KILL_AT`` prints
``killing <ram step> <step>`` and SIGKILLs the process (no stop, no final save);
otherwise ``done <step> <status().tiers>`` at ``MAX_STEPS``.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def main() -> None:
    logdir, ram_root, max_steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    kill_at = int(sys.argv[4]) if len(sys.argv) > 4 else None
    import anyio
    import tensorflow as tf

    import asupervisor as asv
    from asupervisor.testing import capture_logs

    w = tf.Variable(tf.zeros([256, 64]), name="w")
    sv = asv.Supervisor(
        logdir,
        state={"w": w},
        checkpoint=asv.CheckpointOptions(save_secs=3600, ram_tier=ram_root, ram_save_secs=0.05),
        save_summaries_secs=0,
        handle_signals=False,
    )

    def step() -> None:
        w.assign_add(tf.ones_like(w))
        time.sleep(0.005)  # the step's work
        if kill_at is not None and sv.global_step + 1 >= kill_at:
            ram = sv.status().tiers.get("ram")
            if ram is not None and ram >= kill_at:
                print(f"killing {ram} {sv.global_step + 1}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

    async def train() -> None:
        with capture_logs() as logs:
            async with sv.managed_session() as sess:
                restored = [e["tier"] for e in logs if e["event"] == "checkpoint.restored_from_tier"]
                print(f"started {sv.global_step} {float(w[0, 0])} {restored[-1] if restored else 'disk'}", flush=True)
                await sess.run_loop(step, max_steps=max_steps)
        print(f"done {sv.global_step} {dict(sv.status().tiers)}", flush=True)

    anyio.run(train)


if __name__ == "__main__":
    main()
