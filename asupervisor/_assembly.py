"""The assembly: which parts make up a session of a ``Supervisor``.

The one place that names concrete features. ``Supervisor.managed_session()`` hands the
engine (``_core``) the parts built here from the supervisor's settings, in the order
their phases run within each phase: summaries (so the writer is open for the hooks),
the goodput ledger (its last write comes before the checkpoints let the logdir's lock
go), then checkpoints; in multi-worker training first the agreed stop on a signal; and the
Keras front door's part, which offers ``sess.fit`` (the engine imports no front door).
Stock hooks and services that are parts too (queue runners) are added by the engine
itself, from the hooks and services it is given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._checkpoint._part import CheckpointPart
from ._checkpoint.policy._cluster_stop import ClusterStopPart
from ._checkpoint.policy._policies import keep_policy_for, save_policy_for
from ._goodput._part import GoodputPart
from ._keras import KerasPart
from ._progress._part import ProgressPart
from ._summary._part import SummaryPart

if TYPE_CHECKING:
    from ._config import SupervisorConfig
    from ._core._abc import SessionPart

__all__ = ["session_parts"]


def session_parts(config: SupervisorConfig) -> list[SessionPart]:
    """The feature parts of one session of a supervisor with ``config``."""
    progress: list[SessionPart] = [ProgressPart()] if config.progress else []
    cluster_stop: list[SessionPart] = (
        [ClusterStopPart(config.cluster)] if config.multi_worker and config.cluster is not None else []
    )
    keep_policy = config.keep_policy or keep_policy_for(config.max_to_keep, config.keep_checkpoint_every_n_hours)
    remote: list[SessionPart] = []
    store = config.store
    tiered = None
    if config.remote_url is not None and config.logdir is not None:
        # a URL logdir only: the remote store is optional code (checked at construction)
        from ._checkpoint._remote_part import RemotePart
        from ._checkpoint.store import open_remote_tier, open_store, open_tiered_store

        tier = open_remote_tier(
            config.remote_url,
            config.logdir,
            basename=config.checkpoint_basename,
            keep_policy=keep_policy,
            owner=bool(config.is_chief),
        )
        local = store if store is not None else open_store(config.logdir, config.checkpoint_fast_path)
        store = tiered = open_tiered_store(local, tier)
        remote = [RemotePart(tiered, upload_every=config.upload_every, upload_every_secs=config.upload_every_secs)]
    memory = None
    if config.ram_tier is not False and config.logdir is not None:
        from ._checkpoint.store import open_memory_tier  # the RAM tier: optional code, opened when asked for

        memory = open_memory_tier(config.logdir, config.ram_tier, config.checkpoint_fast_path)
    return [
        *progress,
        *cluster_stop,
        SummaryPart(config.logdir, is_chief=bool(config.is_chief), interval_secs=config.save_summaries_secs),
        GoodputPart(config.logdir, is_chief=bool(config.is_chief), interval_secs=config.save_summaries_secs),
        CheckpointPart(
            config.logdir,
            basename=config.checkpoint_basename,
            is_chief=bool(config.is_chief),
            cluster=config.cluster,
            multi_worker=config.multi_worker,
            save_policy=config.save_policy
            or save_policy_for(config.save_model_secs, config.save_model_steps, multi_worker=config.multi_worker),
            keep_policy=keep_policy,
            when_busy=config.checkpoint_when_busy,
            staging=config.checkpoint_staging,
            fast_path=config.checkpoint_fast_path,
            remote=tiered,
            memory=memory,
            ram_save_secs=config.ram_save_secs,
            store=store,
        ),
        *remote,  # after the checkpoint part: its final upload follows the final checkpoint
        KerasPart(),
    ]
