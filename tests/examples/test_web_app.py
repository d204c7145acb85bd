"""``examples/web_app.py``: training inside a Starlette app, served by a real uvicorn on
127.0.0.1 and driven over HTTP with httpx; signals sent to the server process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx  # the dev extra installs the examples' own (httpx, starlette, uvicorn)
import pytest
import uvicorn  # noqa: F401 - the example's server: a missing one fails here, not skips
from _timing import scaled
from prometheus_client.parser import text_string_to_metric_families

APP = Path(__file__).resolve().parents[2] / "examples" / "web_app.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """The example app in a child process; ``get``/``post`` talk to it."""

    def __init__(self, logdir: Path, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
        self.proc = subprocess.Popen(
            [sys.executable, str(APP), "--logdir", str(logdir), "--port", str(self.port), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.client = httpx.Client(base_url=self.url, timeout=scaled(60))

    def wait_until_serving(self) -> None:
        deadline = time.monotonic() + scaled(60)
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.output()
            try:
                self.client.get("/status")
            except httpx.TransportError:
                time.sleep(0.1)  # the server is still starting: poll again
            else:
                return
        raise AssertionError("the server did not start within 60 s")

    def status(self) -> dict[str, Any]:
        response = self.client.get("/status")
        assert response.status_code == 200
        body: dict[str, Any] = response.json()
        return body

    def wait_for(self, predicate: Any) -> dict[str, Any]:
        deadline = time.monotonic() + scaled(60)
        while time.monotonic() < deadline:
            body = self.status()
            if predicate(body):
                return body
            time.sleep(0.05)  # polling a real server over HTTP
        raise AssertionError(f"condition not reached; last status {body}")

    def output(self) -> str:
        if self.proc.poll() is None:
            return ""
        out, _ = self.proc.communicate()
        return out

    def close(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = Server(tmp_path / "run")
    srv.wait_until_serving()
    yield srv
    srv.close()


def test_status_checkpoint_and_stop_over_http(server: Server, tmp_path: Path) -> None:
    """The step advances; ``POST /checkpoint`` returns a committed checkpoint that is on
    disk; ``POST /stop`` ends the training with a final checkpoint at its last step; the
    server goes on serving ``/status``, and a later ``/checkpoint`` is a 409."""
    first = server.wait_for(lambda s: s["global_step"] > 0)
    later = server.wait_for(lambda s: s["global_step"] > first["global_step"] + 5 and s["metrics"])
    assert later["running"] and later["metrics"]["loss"] >= 0 and later["error"] is None
    saved = server.client.post("/checkpoint")
    assert saved.status_code == 200
    info = saved.json()
    assert Path(info["path"] + ".index").exists() and info["step"] >= later["global_step"]
    scraped = server.client.get("/metrics")
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(scraped.text)}
    assert families["asupervisor_global_step"].samples[0].value >= info["step"]
    assert {s.labels["phase"] for s in families["asupervisor_checkpoint_seconds"].samples} >= {
        "blocked",
        "write",
        "commit",
    }
    stopped = server.client.post("/stop").json()
    assert stopped["stop_reason"] == "requested"
    assert stopped["checkpoint"] == str(tmp_path / "run" / f"model.ckpt-{stopped['step']}")
    assert Path(stopped["checkpoint"] + ".index").exists()
    assert not server.status()["running"]
    assert server.client.post("/checkpoint").status_code == 409


def test_a_failed_training_is_reported_not_crashed(tmp_path: Path) -> None:
    """A training whose step raises is reported by ``/status`` (its error and stop
    reason); the application keeps serving."""
    srv = Server(tmp_path / "run", "--fail-at", "20")
    try:
        srv.wait_until_serving()
        failed = srv.wait_for(lambda s: s["error"] is not None)
        assert failed["error"].startswith("FloatingPointError: the loss diverged at step 20")
        assert failed["stop_reason"] == "error:FloatingPointError" and not failed["running"]
        assert srv.proc.poll() is None  # still serving
    finally:
        srv.close()


def test_ctrl_c_stops_training_and_server_cleanly(tmp_path: Path) -> None:
    """One SIGINT to the server: the training stops with a final checkpoint at its last
    step, the lifespan shutdown completes and the server exits 0; started again, it
    resumes from that checkpoint."""
    logdir = tmp_path / "run"
    srv = Server(logdir)
    try:
        srv.wait_until_serving()
        srv.wait_for(lambda s: s["global_step"] > 10)
        srv.proc.send_signal(signal.SIGINT)
        out, _ = srv.proc.communicate(timeout=scaled(90))
    finally:
        srv.close()
    assert srv.proc.returncode == 0, out
    assert "Application shutdown complete" in out, out
    assert "session.stopped" in out and "reason=signal:SIGINT" in out, out
    stopped_at = int(out.split("session.stopped")[1].split("global_step=")[1].split()[0])
    state = (logdir / "checkpoint").read_text()
    assert f'model_checkpoint_path: "model.ckpt-{stopped_at}"' in state
    again = Server(logdir)
    try:
        again.wait_until_serving()
        resumed = again.wait_for(lambda s: s["started_at"] is not None)  # start-up done
        assert resumed["global_step"] >= stopped_at
    finally:
        again.close()
