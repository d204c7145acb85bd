"""Prometheus text for dashboards: ``sv.metrics_text()`` and ``metrics_port`` serving it
on 127.0.0.1 while the session lives, read with a real HTTP client."""

from __future__ import annotations

import re
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import pytest
import tensorflow as tf
from _timing import scaled

import asupervisor as asv

pytestmark = pytest.mark.usefixtures("no_new_threads")

_SAMPLE = re.compile(r'^asupervisor_[a-z_]+(\{([a-z_]+="([^"\\]|\\.)*",?)+\})? (-?[0-9.]+(e[+-]?[0-9]+)?|NaN|[+-]Inf)$')


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=scaled(10)) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _well_formed(text: str) -> dict[str, float]:
    """Every line a comment or a sample; the samples by their name and labels."""
    samples = {}
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        assert _SAMPLE.match(line), line
        key, value = line.rsplit(" ", 1)
        samples[key] = float(value)
    return samples


@pytest.mark.anyio
async def test_metrics_port_serves_the_status_while_the_session_lives(tmp_path: Path) -> None:
    port = _free_port()
    v = tf.Variable(0.0)
    sv = asv.Supervisor(tmp_path, state={"v": v}, save_model_secs=0, handle_signals=False, metrics_port=port)
    assert _well_formed(sv.metrics_text())["asupervisor_up"] == 0

    def step() -> dict[str, Any]:
        v.assign_add(1.0)
        return {"loss": tf.constant(0.5)}

    async with sv.managed_session() as sess:
        for _ in range(7):
            await sess.run(step)
        await sv.save_now()
        code, text = await anyio.to_thread.run_sync(_get, f"http://127.0.0.1:{port}/metrics")
        missing, _ = await anyio.to_thread.run_sync(_get, f"http://127.0.0.1:{port}/other")
    assert code == 200 and missing == 404
    samples = _well_formed(text)
    assert samples["asupervisor_up"] == 1 and samples["asupervisor_global_step"] == 7
    assert samples['asupervisor_metric{name="loss"}'] == 0.5
    assert samples["asupervisor_last_checkpoint_step"] == 7
    assert samples['asupervisor_service_state{service="metrics",state="running"}'] == 1
    assert _well_formed(sv.metrics_text())["asupervisor_up"] == 0
    with pytest.raises(OSError):  # the port is closed with the session
        await anyio.to_thread.run_sync(_get, f"http://127.0.0.1:{port}/metrics")


@pytest.mark.anyio
async def test_the_endpoint_serves_through_the_stop(tmp_path: Path) -> None:
    """While the stop runs (here: a hook's ``end``, after the final checkpoint) the
    endpoint still answers, with the stop reason and the final checkpoint; it closes as
    the session winds down."""
    port = _free_port()
    v = tf.Variable(0.0)
    scraped: list[tuple[int, str]] = []

    class ScrapeAtTheEnd(asv.SessionRunHook):
        def end(self, session: object) -> None:  # on the step thread, the event loop free
            scraped.append(_get(f"http://127.0.0.1:{port}/metrics"))

    sv = asv.Supervisor(tmp_path, state={"v": v}, handle_signals=False, metrics_port=port, hooks=[ScrapeAtTheEnd()])
    async with sv.managed_session() as sess:
        await sess.run_loop(lambda: v.assign_add(1.0), max_steps=5)
    ((code, text),) = scraped
    samples = _well_formed(text)
    assert code == 200 and samples['asupervisor_stop_reason{reason="max_steps"}'] == 1, text
    assert samples["asupervisor_last_checkpoint_step"] == 5
    with pytest.raises(OSError):  # closed with the session
        await anyio.to_thread.run_sync(_get, f"http://127.0.0.1:{port}/metrics")


@pytest.mark.anyio
async def test_the_epoch_and_the_stop_reason_are_exposed(tmp_path: Path) -> None:
    sv = asv.Supervisor(tmp_path, state={"v": tf.Variable(0)}, save_model_secs=0, handle_signals=False)
    seen: list[dict[str, float]] = []
    data = tf.data.Dataset.range(6).batch(2)  # 3 steps an epoch

    def step(batch: tf.Tensor) -> None:
        if sv.global_step == 4:  # the second step of the second epoch
            seen.append(_well_formed(sv.metrics_text()))

    async with sv.managed_session() as sess:
        await sess.run_loop(step, data=data, epochs=2)
    assert (seen[0]["asupervisor_epoch"], seen[0]["asupervisor_epochs"], seen[0]["asupervisor_epoch_step"]) == (1, 2, 1)
    assert "asupervisor_stop_reason" not in " ".join(seen[0])
    after = _well_formed(sv.metrics_text())
    assert after['asupervisor_stop_reason{reason="epochs"}'] == 1 and after["asupervisor_epoch"] == 2


@pytest.mark.anyio
async def test_a_taken_metrics_port_fails_the_start_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        sv = asv.Supervisor(handle_signals=False, metrics_port=port)
        with pytest.raises(OSError, match=rf"metrics_port={port}: cannot listen on 127.0.0.1:{port}"):
            async with sv.managed_session():
                pytest.fail("the session started")


@pytest.mark.parametrize("port", [0, 70000, True, "9100", "0.0.0.0:", ":9100", "0.0.0.0:99999", "[::]:x"])
def test_a_bad_metrics_port_is_a_value_error_naming_it(port: object) -> None:
    with pytest.raises(ValueError, match="metrics_port must be a TCP port"):
        asv.Supervisor(metrics_port=port)  # type: ignore[arg-type]


def _own_addresses() -> list[str]:
    """Addresses of this host other than 127.0.0.1: 127.0.0.2 (Linux answers for all of
    127/8 on its loopback) and the address of its default route, if it has one."""
    found = ["127.0.0.2"] if sys.platform.startswith("linux") else []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet: only picks the route's address
            found.append(str(s.getsockname()[0]))
        except OSError:
            pass
    return sorted(set(found) - {"127.0.0.1", "0.0.0.0"})


@pytest.mark.anyio
async def test_a_host_port_listens_on_that_host(tmp_path: Path) -> None:
    """``metrics_port="0.0.0.0:<port>"`` (a pod's scrape): the text is served on
    127.0.0.1 and on this host's other addresses; ``"127.0.0.1:<port>"`` only there."""
    port = _free_port()
    sv = asv.Supervisor(handle_signals=False, metrics_port=f"0.0.0.0:{port}")
    async with sv.managed_session():
        for host in ["127.0.0.1", *_own_addresses()]:
            body = await anyio.to_thread.run_sync(_raw_get, host, port)
            assert "asupervisor_up 1" in body, (host, body[:200])
    port = _free_port()
    sv = asv.Supervisor(handle_signals=False, metrics_port=f"127.0.0.1:{port}")
    async with sv.managed_session():
        assert "asupervisor_up 1" in await anyio.to_thread.run_sync(_raw_get, "127.0.0.1", port)
        for host in _own_addresses():
            with pytest.raises(OSError):
                await anyio.to_thread.run_sync(_raw_get, host, port)


def _raw_get(host: str, port: int) -> str:
    with socket.create_connection((host, port), timeout=scaled(10)) as conn:
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    return data.decode()


@pytest.mark.anyio
async def test_each_checkpoint_phase_is_a_histogram_the_prometheus_parser_reads(tmp_path: Path) -> None:
    """Three saves: the scrape, parsed by Prometheus's own text parser, has a histogram
    per phase (blocked, write, commit) with three observations each, cumulative
    buckets ending in +Inf, and ``status().save_seconds`` says the same."""
    from prometheus_client.parser import text_string_to_metric_families

    port = _free_port()
    v = tf.Variable(tf.zeros([1000]))
    sv = asv.Supervisor(tmp_path, state={"v": v}, save_model_secs=0, handle_signals=False, metrics_port=port)
    async with sv.managed_session() as sess:
        for _ in range(3):
            await sess.run(lambda: v.assign_add(tf.ones([1000])))
            await sv.save_now()
        _, text = await anyio.to_thread.run_sync(_get, f"http://127.0.0.1:{port}/metrics")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    hist = families["asupervisor_checkpoint_seconds"]
    assert hist.type == "histogram"
    by_phase: dict[str, dict[str, float]] = {}
    for sample in hist.samples:
        key = sample.name.rsplit("_", 1)[1] + sample.labels.get("le", "")
        by_phase.setdefault(sample.labels["phase"], {})[key] = sample.value
    assert set(by_phase) == {"blocked", "write", "commit"}
    for phase, rows in by_phase.items():
        assert rows["count"] == 3 and rows["bucket+Inf"] == 3, phase
        buckets = [value for key, value in rows.items() if key.startswith("bucket")]
        assert buckets == sorted(buckets), phase  # cumulative
        assert rows["sum"] > 0, phase
    status = sv.status().save_seconds
    assert {p: h.count for p, h in status.items()} == {"blocked": 3, "commit": 3, "write": 3}
    assert all(len(h.counts) == len(h.bounds) + 1 and sum(h.counts) == h.count for h in status.values())


@pytest.mark.anyio
async def test_serve_metrics_serves_before_and_after_the_session(tmp_path: Path) -> None:
    """``serve_metrics()`` held around the whole program: the endpoint answers before the
    session (``up 0``), during it, and after it ended with its ``stop_reason``; the session
    starts no endpoint of its own on ``metrics_port`` (it would find the port taken); the
    port closes when the caller lets go."""
    port = _free_port()
    v = tf.Variable(0.0)
    sv = asv.Supervisor(tmp_path, state={"v": v}, handle_signals=False, metrics_port=port)
    url = f"http://127.0.0.1:{port}/metrics"
    async with sv.serve_metrics():
        code, before = await anyio.to_thread.run_sync(_get, url)
        assert code == 200 and _well_formed(before)["asupervisor_up"] == 0
        async with sv.managed_session() as sess:
            for _ in range(4):
                await sess.run(lambda: v.assign_add(1.0))
            during = _well_formed((await anyio.to_thread.run_sync(_get, url))[1])
        code, after = await anyio.to_thread.run_sync(_get, url)
    assert during["asupervisor_up"] == 1 and during["asupervisor_global_step"] == 4
    samples = _well_formed(after)
    assert code == 200 and samples['asupervisor_stop_reason{reason="completed"}'] == 1, after
    assert samples["asupervisor_up"] == 0 and samples["asupervisor_last_checkpoint_step"] == 4
    with pytest.raises(OSError):  # closed when the caller let go
        await anyio.to_thread.run_sync(_get, url)


@pytest.mark.anyio
async def test_serve_metrics_lingers_for_one_more_scrape(tmp_path: Path) -> None:
    """With ``linger_secs``, leaving waits for the next scrape (here one that starts only
    once the program is leaving: it is answered, with the final status), or the linger's
    end when none comes."""
    port = _free_port()
    v = tf.Variable(0.0)
    sv = asv.Supervisor(tmp_path, state={"v": v}, handle_signals=False)
    url = f"http://127.0.0.1:{port}/metrics"
    leaving = anyio.Event()
    scraped: list[tuple[int, str]] = []

    async def scrape_once_leaving() -> None:
        await leaving.wait()
        scraped.append(await anyio.to_thread.run_sync(_get, url))

    async with anyio.create_task_group() as tg:
        tg.start_soon(scrape_once_leaving)
        t0 = anyio.current_time()
        async with sv.serve_metrics(f"127.0.0.1:{port}", linger_secs=scaled(60)):
            async with sv.managed_session() as sess:
                await sess.run_loop(lambda: v.assign_add(1.0), max_steps=3)
            leaving.set()
        assert anyio.current_time() - t0 < scaled(50)  # left at the scrape, not the linger's end
    ((code, text),) = scraped
    assert code == 200 and _well_formed(text)['asupervisor_stop_reason{reason="max_steps"}'] == 1, text

    t0 = anyio.current_time()
    async with sv.serve_metrics(port, linger_secs=0.3):
        pass
    assert anyio.current_time() - t0 >= 0.3  # no scrape came: the linger ran out


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({}, "needs an address"), ({"address": 9100, "linger_secs": -1}, "-1"), ({"address": "x:"}, "'x:'")],
)
@pytest.mark.anyio
async def test_serve_metrics_refuses_bad_input_naming_it(kwargs: dict[str, Any], match: str) -> None:
    sv = asv.Supervisor(handle_signals=False)
    with pytest.raises(ValueError, match=re.escape(match)):
        async with sv.serve_metrics(**kwargs):
            pass
