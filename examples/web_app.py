"""Training inside a web application: Starlette served by uvicorn.

The application trains in its lifespan (a task beside the server, on the same event
loop) and serves:

* ``GET /status`` — ``sv.status().to_dict()`` (step, steps/sec, loss, ETA, last
  checkpoint, services) and the training's error, if it failed;
* ``POST /checkpoint`` — returns once a checkpoint is committed, with its path and step
  (409 when no training is running);
* ``POST /stop`` — stops the training gracefully and returns once the final checkpoint is
  committed;
* ``GET /metrics`` — ``sv.metrics_text()``, the Prometheus text a scraper reads (step,
  steps/sec, loss, each checkpoint phase's seconds, ...).

A failed training is reported by ``/status``; the server keeps serving. Ctrl-C (or
SIGTERM) stops the training with a final checkpoint *and* shuts the server down: the
session's signal handler calls uvicorn's, which it found installed. Running it again
resumes from the last checkpoint.

uvicorn runs on asyncio; for trio see ``examples/trio_jobs.py``. Needs the ``examples``
extra (``pip install 'asupervisor[examples]'``)::

    python examples/web_app.py --logdir runs/web --port 8000
    curl -s localhost:8000/status; curl -s -X POST localhost:8000/checkpoint
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import anyio
import anyio.abc
import tensorflow as tf
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

import asupervisor as asv


class Trainer:
    """One training run for the lifespan of the application.

    Args:
        logdir: checkpoints and summaries.
        fail_at: make the step raise at this global step (to see how a failure shows).
    """

    def __init__(self, logdir: str, *, fail_at: int | None = None) -> None:
        tf.keras.utils.set_random_seed(0)
        self.model = tf.keras.Sequential(
            [tf.keras.Input((8,)), tf.keras.layers.Dense(32, activation="relu"), tf.keras.layers.Dense(1)]
        )
        self.optimizer = tf.keras.optimizers.SGD(0.01)
        self.sv = asv.Supervisor(
            logdir,
            state={"model": self.model, "optimizer": self.optimizer},
            save_model_secs=60,
            save_summaries_secs=10,
        )
        self.fail_at = fail_at
        self.error: str | None = None
        self.finished: anyio.Event | None = None  # set once the training has ended
        self._train_step = tf.function(self._step)

    def _step(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        y = tf.reduce_sum(tf.sin(x), axis=1, keepdims=True)  # a function to learn
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((self.model(x) - y) ** 2)
        grads = tape.gradient(loss, self.model.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
        return {"loss": loss}

    def step(self) -> dict[str, tf.Tensor]:
        """One training step (on the supervisor's step thread)."""
        if self.fail_at is not None and self.sv.global_step >= self.fail_at:
            raise FloatingPointError(f"the loss diverged at step {self.sv.global_step}")
        return self._train_step(tf.random.normal([64, 8]))  # type: ignore[no-any-return]

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Train until stopped; an error is kept for ``/status``, not raised into the app."""
        self.finished = anyio.Event()
        task_status.started()
        try:
            async with self.sv.managed_session() as sess:
                await sess.run_loop(self.step)
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.finished.set()


def create_app(logdir: str, *, fail_at: int | None = None, trainer: Trainer | None = None) -> Starlette:
    """The web application training into ``logdir`` (or running ``trainer``, e.g. a
    subclass with another model, as ``bench/embed_latency.py`` does)."""
    trainer = Trainer(logdir, fail_at=fail_at) if trainer is None else trainer

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:
            await tg.start(trainer.run)
            yield
            # The server is shutting down: cancelling the training is a graceful stop
            # (the final checkpoint is saved), then the task group ends.
            tg.cancel_scope.cancel()

    async def status(request: Request) -> JSONResponse:
        body: dict[str, Any] = trainer.sv.status().to_dict()
        body["error"] = trainer.error
        return JSONResponse(body)

    async def checkpoint(request: Request) -> JSONResponse:
        try:
            info = await trainer.sv.save_now()
        except RuntimeError as exc:  # no running training
            return JSONResponse({"error": str(exc)}, status_code=409)
        return JSONResponse({"path": info.path, "step": info.step})

    async def stop(request: Request) -> JSONResponse:
        try:
            trainer.sv.request_stop()
        except RuntimeError as exc:  # the training never started
            return JSONResponse({"error": str(exc)}, status_code=409)
        assert trainer.finished is not None
        await trainer.finished.wait()
        final = trainer.sv.status()
        last = final.last_checkpoint
        return JSONResponse(
            {"stop_reason": final.stop_reason, "step": final.global_step, "checkpoint": last.path if last else None}
        )

    async def metrics(request: Request) -> PlainTextResponse:
        return PlainTextResponse(trainer.sv.metrics_text(), media_type="text/plain; version=0.0.4")

    routes = [
        Route("/status", status),
        Route("/metrics", metrics),
        Route("/checkpoint", checkpoint, methods=["POST"]),
        Route("/stop", stop, methods=["POST"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def main() -> None:
    parser = argparse.ArgumentParser(description="training inside a Starlette app served by uvicorn")
    parser.add_argument("--logdir", default="runs/web")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--fail-at", type=int, default=None, help="make the step fail at this global step")
    args = parser.parse_args()
    asv.configure_logging()
    uvicorn.run(create_app(args.logdir, fail_at=args.fail_at), host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
