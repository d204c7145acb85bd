"""A two-worker ``MultiWorkerMirroredStrategy`` cluster on a URL logdir, as real processes
against moto's S3 server: the chief uploads, the other worker never writes the remote, and
a cluster on fresh machines (empty local working directories) resumes from the remote."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _timing import scaled
from servers import Server, s3_keys

SCRIPT = Path(__file__).resolve().parents[1] / "checkpoint" / "scripts" / "mw_train.py"


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("localhost", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _run_cluster(tmp_path: Path, url: str, max_steps: int, machine: str) -> list[list[str]]:
    """Chief and worker to ``max_steps``, each with its own user cache (its own machine)."""
    chief_port, worker_port = _free_ports(2)
    cluster = {"chief": [f"localhost:{chief_port}"], "worker": [f"localhost:{worker_port}"]}
    procs = []
    for task in ("chief", "worker"):
        home = tmp_path / f"{machine}-{task}"
        (home / "tmp").mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "TF_CPP_MIN_LOG_LEVEL": "3",
            "TMPDIR": str(home / "tmp"),
            "XDG_CACHE_HOME": str(home / "cache"),
            "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": task, "index": 0}}),
        }
        args = [sys.executable, str(SCRIPT), url, str(max_steps), "3", "asyncio", str(tmp_path / f"{task}.npz")]
        procs.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    results = []
    try:
        for proc in procs:
            results.append(proc.communicate(timeout=scaled(90)))
    finally:
        for proc in procs[len(results) :]:
            proc.kill()
            proc.communicate()
    for proc, (_, err) in zip(procs, results):
        assert proc.returncode == 0, err[-3000:]
    return [out.splitlines() for out, _ in results]


_keys = s3_keys


@pytest.mark.timeout(240)
def test_a_cluster_on_a_url_logdir_resumes_on_fresh_machines(s3_url: str, s3_env: Server, tmp_path: Path) -> None:
    """The chief uploads (the worker's saves stay temporary and local); both restore the
    remote's checkpoint on new machines and end with the same weights."""
    chief, worker = _run_cluster(tmp_path, s3_url, 7, "first")
    assert chief[-1] == worker[-1] == "DONE 7 max_steps"
    keys = _keys(s3_env.endpoint, s3_url)
    assert "model.ckpt-7.asv-commit" in keys, keys
    assert not list((tmp_path / "first-worker" / "cache").rglob("*.index"))  # the worker wrote nothing lasting

    chief, worker = _run_cluster(tmp_path, s3_url, 12, "second")
    assert chief[0].startswith("RESTORED 7 ") and worker[0].startswith("RESTORED 7 "), (chief[0], worker[0])
    assert chief[-1] == worker[-1] == "DONE 12 max_steps"
    assert "model.ckpt-12.asv-commit" in _keys(s3_env.endpoint, s3_url)
    a, b = np.load(tmp_path / "chief.npz"), np.load(tmp_path / "worker.npz")
    assert all(a[k].tobytes() == b[k].tobytes() for k in a.files)
    assert float(a["counter"]) == 24.0
