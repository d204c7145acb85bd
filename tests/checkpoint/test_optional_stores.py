"""The fast and remote stores are optional code: with ``asupervisor._checkpoint.store.fast``,
``asupervisor._checkpoint.store.remote`` and fsspec unimportable (an import hook refuses
them, as ``tests/test_tf_internals.py`` hides TF names), ``import asupervisor`` works, a
training on the plain store saves, a second process resumes from it, none of the hidden
modules is imported on the way, and the settings that need them are refused by name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _timing import scaled

SCRIPT = Path(__file__).parent / "scripts" / "hidden_stores_train.py"


def _run(logdir: Path, max_steps: int, *extra: str) -> list[str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("ASUPERVISOR_CHECKPOINT_STORE", None)
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(logdir), str(max_steps), *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=scaled(240),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.splitlines()


@pytest.mark.timeout(300)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fast store exists on Linux only")
def test_a_training_without_the_fast_and_remote_stores_saves_and_resumes(tmp_path: Path) -> None:
    """Hidden stores: the first process trains to step 12 on the plain store and imports
    none of them; a second (hidden too) resumes at 12 and trains to 20; a process with
    every store there (the fast one, by default on Linux) resumes that at 20: either
    store reads what the other wrote. A URL logdir and ``checkpoint_store="fast"`` are
    refused at construction, each naming what is missing."""
    logdir = tmp_path / "run"
    first = _run(logdir, 12)
    assert first[0] == "started 0"
    assert first[1].startswith("done 12 ") and first[1].endswith(" plain"), first
    assert first[2] == "leaked - True", first
    assert any(line.startswith("refused url: ") and "s3://bucket/run" in line for line in first), first
    assert any(line.startswith("refused fast: ") and "store.fast" in line for line in first), first

    second = _run(logdir, 20)
    assert second[0] == "started 12" and second[1].startswith("done 20 ") and second[2] == "leaked - True", second

    full = _run(logdir, 24, "--no-hide")
    assert full[0] == "started 20" and full[1].startswith("done 24 ") and full[1].endswith(" fast"), full
    sums = [float(lines[1].split()[2]) for lines in (first, second, full)]
    assert sums[1] - sums[0] == pytest.approx(8 * 256 * 64) and sums[2] - sums[1] == pytest.approx(4 * 256 * 64)
