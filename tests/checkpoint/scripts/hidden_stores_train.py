"""A training whose installation lacks the optional stores: ``asupervisor._checkpoint.store.fast``,
``asupervisor._checkpoint.store.remote`` and fsspec cannot be imported (an import hook
refuses them, as a build without them would).

Usage: ``hidden_stores_train.py LOGDIR MAX_STEPS [--no-hide]``. Trains a seeded state into
LOGDIR on the store ``auto`` picks (the plain one, with the fast store missing) to
MAX_STEPS, resuming from LOGDIR's newest checkpoint; prints ``started <step>``, then
``done <step> <sum of the weights> <store kind>`` and the hidden modules that got
imported anyway (``leaked ...``), then checks the two refusals (a URL logdir,
``checkpoint_store="fast"``) and prints ``refused url`` / ``refused fast``.
"""

from __future__ import annotations

import importlib.abc
import sys

HIDDEN = ("asupervisor._checkpoint.store.fast", "asupervisor._checkpoint.store.remote", "fsspec")


class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object, target: object = None) -> None:
        if any(name == h or name.startswith(h + ".") for h in HIDDEN):
            raise ImportError(f"{name} is not installed here (hidden by the test)", name=name)
        return None


def main() -> None:
    logdir, max_steps = sys.argv[1], int(sys.argv[2])
    if "--no-hide" not in sys.argv:
        sys.meta_path.insert(0, _Hide())
    import anyio
    import tensorflow as tf

    import asupervisor as asv

    tf.keras.utils.set_random_seed(5)
    w = tf.Variable(tf.random.normal([256, 64]), name="w")
    sv = asv.Supervisor(logdir, state={"w": w}, save_model_steps=5, save_model_secs=0, handle_signals=False)

    async def train() -> None:
        async with sv.managed_session() as sess:
            print(f"started {sv.global_step}", flush=True)
            await sess.run_loop(lambda: w.assign_add(tf.ones_like(w)), max_steps=max_steps)

    anyio.run(train)
    kind = sv.status().last_checkpoint
    from asupervisor._checkpoint.store import resolve_store

    print(f"done {sv.global_step} {float(tf.reduce_sum(w)):.3f} {resolve_store().kind}", flush=True)
    leaked = sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in HIDDEN))
    print(f"leaked {' '.join(leaked) or '-'} {kind is not None}", flush=True)
    for what, make in (
        ("url", lambda: asv.Supervisor("s3://bucket/run", state={"w": w})),
        ("fast", lambda: asv.Supervisor(logdir, state={"w": w}, checkpoint_store="fast")),
    ):
        try:
            make()
        except ValueError as exc:
            print(f"refused {what}: {exc}", flush=True)


if __name__ == "__main__":
    main()
