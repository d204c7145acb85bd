"""``asupervisor inspect`` of a URL logdir: its committed checkpoints from their markers,
the objects of uploads that never committed, the state object and the lease's holder,
read without downloading anything (the front door reaches it through the store's door).
"""

from __future__ import annotations

from typing import Any

from ...._exceptions import SupervisorError
from .._url import check_url, default_local_dir
from ._layout import MARKER_SUFFIX, Marker, marker_problem
from ._tier import RemoteTier

__all__ = ["inspect_remote"]


def inspect_remote(url: str) -> dict[str, Any]:
    """``asupervisor inspect`` of a URL logdir, from its listing, markers and state object
    (nothing is downloaded: "loads" means the objects match their commit marker)."""
    url = check_url(url)
    tier = RemoteTier(url, default_local_dir(url, "inspect"), basename=None, keep_policy=None, owner=False)
    try:
        tier.open()
        state, problem = tier.read_state()
        listed = tier.checkpoints()
        owner = tier.lease_owner()
        checkpoints = []
        for ckpt in [c for c in listed if c.committed]:
            error: str | None = None
            when: float | None = None
            metrics: dict[str, float] = {}
            try:
                marker = Marker.from_bytes(tier.fs.cat_file(tier.fs.path(ckpt.name + MARKER_SUFFIX)))
                when = marker.committed_at
                metrics = marker.metrics
                error = marker_problem(marker, ckpt.sizes)
            except (FileNotFoundError, ValueError) as exc:
                error = f"commit marker unreadable: {exc}"
            checkpoints.append(
                {
                    "name": ckpt.name,
                    "step": ckpt.step,
                    "time": when,
                    "bytes": sum(size for name, size in ckpt.sizes.items() if not name.endswith(MARKER_SUFFIX)),
                    "loads": error is None,
                    "error": error,
                    "metrics": metrics,
                    "named_in_state_file": state is not None and ckpt.name in state.paths,
                    "latest": state is not None and ckpt.name == state.latest,
                }
            )
        leftovers = sorted(name for c in listed if not c.committed for name in c.sizes)
    except SupervisorError as exc:
        raise FileNotFoundError(str(exc)) from None
    finally:
        tier.close()
    report: dict[str, Any] = {
        "logdir": url,
        "state_file": {"latest": None if state is None else state.latest, "problem": problem},
        "checkpoints": checkpoints,
        "leftovers": leftovers,
        "iterator_share": None,
        "scalars": {},
        "owner": owner,
    }
    report["ok"] = problem is None and all(c["loads"] for c in checkpoints)
    return report
