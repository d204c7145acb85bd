"""Prometheus text for dashboards: ``Supervisor.metrics_text()`` and ``metrics_port``.

:func:`render` turns a ``Status`` into the Prometheus text exposition format (version
0.0.4): the step, the rate, the epoch, the last checkpoint, the step output's scalars,
the services' states and restarts, the queues, each checkpoint phase's seconds
(histograms), a URL logdir's remote lag, the stop reason, the run's goodput ledger
(``goodput_*``, ``badput_time_seconds{badput_source=...}``: the names of Google's
``ml-goodput-measurement``). :class:`MetricsServer`
is a session service serving that text at ``http://<host>:<port>/metrics`` (127.0.0.1
unless ``metrics_port="host:port"`` names another: ``"0.0.0.0:9100"`` in a pod) while the
session lives, its stop included (the stop reason, the final checkpoint), until it winds
down (a few lines of HTTP/1.1 on an anyio listener: one request a connection, no
dependency). :func:`held_endpoint` serves the same while an application holds it
(``Supervisor.serve_metrics``: across sessions and after the last, on the caller's loop,
so no thread outlives a session). A front door; no TensorFlow.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager

import anyio
from anyio.abc import Listener, SocketStream, TaskStatus

from ._core._services import Service, ServiceContext
from ._core._status import Histogram, Status
from ._logging import describe, get_logger

__all__ = ["MetricsServer", "held_endpoint", "parse_address", "render"]

log = get_logger(__name__)

_PREFIX = "asupervisor"
_MAX_REQUEST = 8192  # bytes of a request's head read at most
_READ_SECS = 5.0  # a client that sends no request head in this long is dropped


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def metric(self, name: str, kind: str, doc: str, samples: Iterable[tuple[dict[str, str], float | None]]) -> None:
        rows = [(labels, value) for labels, value in samples if value is not None]
        if not rows:
            return
        full = f"{_PREFIX}_{name}"
        self.lines += [f"# HELP {full} {doc}", f"# TYPE {full} {kind}"]
        for labels, value in rows:
            assert value is not None
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            self.lines.append(f"{full}{{{text}}} {_number(value)}" if text else f"{full} {_number(value)}")

    def histogram(self, name: str, doc: str, label: str, histograms: Mapping[str, Histogram]) -> None:
        """One histogram family: a ``label`` value per histogram, cumulative ``le`` buckets."""
        if not histograms:
            return
        full = f"{_PREFIX}_{name}"
        self.lines += [f"# HELP {full} {doc}", f"# TYPE {full} histogram"]
        for key, h in histograms.items():
            own = f'{label}="{_escape(key)}"'
            running = 0
            for bound, n in zip((*h.bounds, math.inf), h.counts):
                running += n
                self.lines.append(f'{full}_bucket{{{own},le="{_number(bound)}"}} {running}')
            self.lines += [f"{full}_sum{{{own}}} {_number(h.sum)}", f"{full}_count{{{own}}} {h.count}"]


def render(status: Status) -> str:
    """``status`` in the Prometheus text format (one metric family per quantity)."""
    w = _Writer()
    w.metric("up", "gauge", "Whether a managed session is running.", [({}, 1.0 if status.running else 0.0)])
    w.metric("global_step", "gauge", "Steps completed, the restored step included.", [({}, status.global_step)])
    w.metric("steps_per_second", "gauge", "The step rate last measured.", [({}, status.steps_per_sec)])
    w.metric("max_steps", "gauge", "The max_steps of the run_loop running now.", [({}, status.max_steps)])
    w.metric("eta_seconds", "gauge", "Seconds until max_steps at the current rate.", [({}, status.eta_secs)])
    w.metric("started_timestamp_seconds", "gauge", "When the session started.", [({}, status.started_at)])
    w.metric("epoch", "gauge", "Epochs completed (run_loop(epochs=) or fit).", [({}, status.epoch)])
    w.metric("epochs", "gauge", "The epochs of the run_loop running now.", [({}, status.epochs)])
    w.metric("epoch_step", "gauge", "Steps into the epoch in progress.", [({}, status.epoch_step)])
    w.metric(
        "stop_reason",
        "gauge",
        "Why the session stopped or is stopping (1 for the reason), once it does.",
        [({"reason": status.stop_reason}, 1.0)] if status.stop_reason else [],
    )
    last = status.last_checkpoint
    w.metric(
        "last_checkpoint_step",
        "gauge",
        "The step of the last committed checkpoint.",
        [({}, None if last is None else last.step)],
    )
    w.metric(
        "last_checkpoint_timestamp_seconds",
        "gauge",
        "When the last checkpoint was committed.",
        [({}, None if last is None else last.time)],
    )
    w.metric(
        "metric",
        "gauge",
        "The latest scalar values of the step's output.",
        [({"name": name}, value) for name, value in sorted(status.metrics.items())],
    )
    w.metric(
        "service_state",
        "gauge",
        "Each service's state (1 for the state it is in).",
        [({"service": name, "state": state}, 1.0) for name, state in sorted(status.services.items())],
    )
    w.metric(
        "service_restarts_total",
        "counter",
        "How many times each service was restarted after a failure.",
        [({"service": name}, n) for name, n in sorted(status.restarts.items())],
    )
    queues = sorted(status.queues.items())
    w.metric("queue_size", "gauge", "Items in each queue runner's queue.", [({"queue": n}, q.size) for n, q in queues])
    w.metric("queue_capacity", "gauge", "Each queue's capacity.", [({"queue": n}, q.capacity) for n, q in queues])
    w.metric(
        "queue_consumer_wait_seconds_total",
        "counter",
        "Time the step loop waited for each queue.",
        [({"queue": n}, q.consumer_wait_secs) for n, q in queues],
    )
    w.histogram(
        "checkpoint_seconds",
        "What each checkpoint cost, by phase: blocked (the step thread), write, commit, upload.",
        "phase",
        status.save_seconds,
    )
    goodput = status.goodput
    if goodput is not None:
        w.metric("goodput_ratio", "gauge", "Productive time over wall time, across restarts.", [({}, goodput.goodput)])
        w.metric(
            "goodput_time_seconds",
            "gauge",
            "Time in steps whose work was kept, across restarts.",
            [({}, goodput.productive_secs)],
        )
        w.metric(
            "badput_time_seconds",
            "gauge",
            "Wall time that was not productive, by cause, across restarts.",
            [({"badput_source": cause}, secs) for cause, secs in goodput.badput.items()],
        )
        w.metric("elapsed_time_seconds", "gauge", "The run's wall time, across restarts.", [({}, goodput.wall_secs)])
        w.metric("run_restarts", "gauge", "How many times the run was started again.", [({}, goodput.restarts)])
        w.metric("redone_steps", "gauge", "Steps run again after restarts.", [({}, goodput.redone_steps)])
    remote = status.remote
    if remote is not None:
        url = {"url": remote.url}
        w.metric(
            "remote_uploaded_step", "gauge", "The newest step committed on the remote.", [(url, remote.uploaded_step)]
        )
        w.metric("remote_lag_steps", "gauge", "Steps the remote is behind the local tier.", [(url, remote.lag_steps)])
        w.metric("remote_lag_seconds", "gauge", "Seconds of training the remote lacks.", [(url, remote.lag_secs)])
        w.metric(
            "remote_error",
            "gauge",
            "1 while something is wrong with the remote.",
            [(url, float(remote.error is not None))],
        )
        w.metric(
            "remote_last_commit_age_seconds",
            "gauge",
            "Seconds since the newest commit on the remote.",
            [(url, remote.last_commit_age_secs)],
        )
        w.metric(
            "remote_stalled", "gauge", "1 while the upload in flight makes no progress.", [(url, float(remote.stalled))]
        )
        w.metric(
            "remote_fenced", "gauge", "1 once another training took the logdir over.", [(url, float(remote.fenced))]
        )
    return "\n".join(w.lines) + "\n"


def parse_address(value: object) -> tuple[str, int]:
    """``metrics_port`` as ``(host, port)``: a port (on 127.0.0.1) or ``"host:port"``
    (``"0.0.0.0:9100"``: every IPv4 address, for a pod's scrape; ``"[::]:9100"``: IPv6).

    Raises:
        ValueError: not a port 1-65535, or a string that is not ``host:port``; the
            message names the value.
    """
    host, port = "127.0.0.1", value
    if isinstance(value, str):
        head, sep, tail = value.rpartition(":")
        host = head[1:-1] if head.startswith("[") and head.endswith("]") else head
        port = int(tail) if sep and host and tail.isdigit() else None
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(
            f"metrics_port must be a TCP port (1-65535), 'host:port' (e.g. '0.0.0.0:9100') or None, got {value!r}"
        )
    return host, port


class MetricsServer(Service):
    """Serves :func:`render` of ``status()`` at ``http://<host>:<port>/metrics``.

    Args:
        address: ``metrics_port``: a TCP port on 127.0.0.1, or ``"host:port"``
            (:func:`parse_address`).
        status: the status source (``Supervisor.status``).
    """

    name = "metrics"
    restart = None  # the port taken: the start fails, naming it
    through_stop = True  # the stop reason, and the final checkpoint, while the stop runs

    def __init__(self, address: int | str, status: Callable[[], Status]) -> None:
        self.address = address
        self.host, self.port = parse_address(address)
        self.status = status
        self._scraped: anyio.Event | None = None  # set at the next scrape answered

    async def listen(self) -> Listener[SocketStream]:
        """The listener on the address (an ``OSError`` naming it when it is taken)."""
        try:
            return await anyio.create_tcp_listener(local_host=self.host, local_port=self.port)
        except OSError as exc:
            raise OSError(
                exc.errno, f"metrics_port={self.address!r}: cannot listen on {self.host}:{self.port}: {exc.strerror}"
            ) from exc

    async def run(self, ctx: ServiceContext, *, task_status: TaskStatus[None]) -> None:
        """Listen (the start fails if the port is taken), then serve until cancelled."""
        async with await self.listen() as listener:
            task_status.started()
            ctx.set_service_state(self.name, "running")
            log.info("metrics.serving", url=f"http://{self.host}:{self.port}/metrics")
            await listener.serve(self._handle)

    async def next_scrape(self) -> None:
        """Return after the next ``/metrics`` answer is sent."""
        if self._scraped is None:
            self._scraped = anyio.Event()
        await self._scraped.wait()

    async def _handle(self, stream: SocketStream) -> None:
        async with stream:
            try:
                head = b""
                with anyio.fail_after(_READ_SECS):
                    while b"\r\n\r\n" not in head and len(head) < _MAX_REQUEST:
                        head += await stream.receive(4096)
                request = head.split(b"\r\n", 1)[0].split()
                if len(request) >= 2 and request[0] == b"GET" and request[1].split(b"?")[0] == b"/metrics":
                    body, code = render(self.status()).encode(), b"200 OK"
                    kind = b"text/plain; version=0.0.4; charset=utf-8"
                else:
                    body, code, kind = b"not found: the metrics are at /metrics\n", b"404 Not Found", b"text/plain"
                await stream.send(
                    b"HTTP/1.1 "
                    + code
                    + b"\r\nContent-Type: "
                    + kind
                    + b"\r\nContent-Length: "
                    + str(len(body)).encode()
                    + b"\r\nConnection: close\r\n\r\n"
                    + body
                )
                if code == b"200 OK" and self._scraped is not None:
                    self._scraped.set()
                    self._scraped = None
            except (anyio.EndOfStream, anyio.BrokenResourceError, TimeoutError, OSError) as exc:
                log.debug("metrics.request_dropped", error=describe(exc))


@asynccontextmanager
async def held_endpoint(server: MetricsServer, linger_secs: float) -> AsyncIterator[None]:
    """Serve ``server`` while the caller holds it (``Supervisor.serve_metrics``): on the
    caller's event loop, no thread. On the way out (not a cancellation), up to
    ``linger_secs`` waiting for one more scrape, so the last status is read."""
    async with await server.listen() as listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, server._handle)
        log.info("metrics.serving", url=f"http://{server.host}:{server.port}/metrics", held=True)
        try:
            yield
            if linger_secs > 0:
                with anyio.move_on_after(linger_secs):
                    await server.next_scrape()
        finally:
            tg.cancel_scope.cancel()
