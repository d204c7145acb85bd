"""Exports a model to TARGET again and again, alternating two sets of weights; prints
``begin <i>`` before each export, for a test that SIGKILLs it mid-export."""

from __future__ import annotations

import sys

import anyio
import keras
import numpy as np

import asupervisor as asv

target = sys.argv[1]
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(2)])
weights = [model.get_weights(), [np.full_like(w, 0.5) for w in model.get_weights()]]
sv = asv.Supervisor(None, state={"model": model}, handle_signals=False)


async def main() -> None:
    i = 0
    while True:
        model.set_weights(weights[i % 2])
        print(f"begin {i}", flush=True)
        await sv.export(model, target)
        i += 1


anyio.run(main)
