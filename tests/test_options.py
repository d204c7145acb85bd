"""``Supervisor``'s grouped settings (``CheckpointOptions``, ``SummaryOptions``,
``StopOptions``) and the public extension surface (``ServiceContext`` names public types
only)."""

from __future__ import annotations

import dataclasses
import inspect
import math
import types
import typing
from pathlib import Path
from typing import Any

import anyio
import pytest

import asupervisor as asv
from asupervisor.testing import ManualClock

# -- the options objects -------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (
            lambda: asv.CheckpointOptions(save_secs=-1),
            ValueError,
            "CheckpointOptions.save_secs must be a number of seconds >= 0, got -1",
        ),
        (
            lambda: asv.CheckpointOptions(save_secs="often"),
            TypeError,
            "CheckpointOptions.save_secs must be a number of seconds or 'auto', got 'often'",
        ),
        (
            lambda: asv.CheckpointOptions(save_steps=0),
            ValueError,
            "CheckpointOptions.save_steps must be a positive int or None, got 0",
        ),
        (
            lambda: asv.CheckpointOptions(max_to_keep=0),
            ValueError,
            "CheckpointOptions.max_to_keep must be an int >= 1 or None (keep all), got 0",
        ),
        (
            lambda: asv.CheckpointOptions(keep_every_n_hours=math.nan),
            ValueError,
            "CheckpointOptions.keep_every_n_hours must be a number of hours >= 0, got nan",
        ),
        (
            lambda: asv.CheckpointOptions(save_policy=100),
            TypeError,
            "CheckpointOptions.save_policy must be a SavePolicy or None, got 100",
        ),
        (
            lambda: asv.CheckpointOptions(keep_policy="latest"),
            TypeError,
            "CheckpointOptions.keep_policy must be a KeepPolicy or None, got 'latest'",
        ),
        (
            lambda: asv.CheckpointOptions(basename="a/b"),
            ValueError,
            "CheckpointOptions.basename must be a file name, got 'a/b'",
        ),
        (
            lambda: asv.CheckpointOptions(when_busy="drop"),
            ValueError,
            "CheckpointOptions.when_busy must be 'wait' or 'skip', got 'drop'",
        ),
        (lambda: asv.CheckpointOptions(staging=1), TypeError, "CheckpointOptions.staging must be True or False, got 1"),
        (lambda: asv.CheckpointOptions(store="quick"), ValueError, "CheckpointOptions.store must be one of"),
        (
            lambda: asv.CheckpointOptions(local_dir=3),
            TypeError,
            "CheckpointOptions.local_dir must be a local path or None, got 3",
        ),
        (
            lambda: asv.CheckpointOptions(upload_every=0),
            ValueError,
            "CheckpointOptions.upload_every must be an int >= 1, got 0",
        ),
        (
            lambda: asv.CheckpointOptions(upload_every_secs="1"),
            TypeError,
            "CheckpointOptions.upload_every_secs must be a number of seconds or None, got '1'",
        ),
        (
            lambda: asv.SummaryOptions(save_secs=math.inf),
            ValueError,
            "SummaryOptions.save_secs must be a number of seconds >= 0, got inf",
        ),
        (
            lambda: asv.SummaryOptions(save_secs=None),
            TypeError,
            "SummaryOptions.save_secs must be a number of seconds, got None",
        ),
        (
            lambda: asv.StopOptions(grace_secs=-0.5),
            ValueError,
            "StopOptions.grace_secs must be a number of seconds >= 0, got -0.5",
        ),
        (
            lambda: asv.StopOptions(signals=("SIGNOPE",)),
            ValueError,
            "StopOptions.signals: stop_signals: no signal 'SIGNOPE'",
        ),
        (lambda: asv.StopOptions(signals="SIGTERM"), TypeError, "StopOptions.signals: "),
        (
            lambda: asv.StopOptions(handle_signals="yes"),
            TypeError,
            "StopOptions.handle_signals must be True or False, got 'yes'",
        ),
    ],
)
def test_a_bad_field_is_an_error_naming_it_and_its_value(make: Any, error: type[Exception], message: str) -> None:
    """Each options object checks its fields as it is made; the message names the field
    (``Options.field``) and the value."""
    with pytest.raises(error) as info:
        make()
    assert str(info.value).startswith(message), str(info.value)


def test_a_policy_with_the_settings_it_replaces_is_an_error() -> None:
    """``save_policy`` with ``save_secs``/``save_steps``, or ``keep_policy`` with
    ``max_to_keep``, is a ``ValueError`` naming both, as with the flat keywords."""
    with pytest.raises(ValueError, match=r"save_policy=.* or save_secs / save_steps, not both"):
        asv.CheckpointOptions(save_policy=asv.EverySteps(10), save_steps=5)
    with pytest.raises(ValueError, match=r"keep_policy=.* or max_to_keep / keep_every_n_hours, not both"):
        asv.CheckpointOptions(keep_policy=asv.LatestN(3), max_to_keep=2)


def test_options_are_frozen_keyword_only_and_hashable() -> None:
    """Options are values: frozen, compared and hashed by their fields, keyword-only; a
    list of signals is kept as a tuple."""
    options = asv.StopOptions(signals=["SIGTERM"])
    assert options.signals == ("SIGTERM",)
    assert options == asv.StopOptions(signals=("SIGTERM",)) and hash(options) == hash(
        asv.StopOptions(signals=("SIGTERM",))
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.grace_secs = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        asv.SummaryOptions(60)  # type: ignore[misc]


def test_every_field_names_a_supervisor_keyword_with_the_same_default() -> None:
    """Each field stands for one flat ``Supervisor`` keyword: one in the signature, with
    the field's default, or one of ``**flat`` (typed by ``_FlatKeywords``, defaulted by
    the field). ``_FlatKeywords`` lists exactly those, and ``clock``."""
    from asupervisor._supervisor import _FlatKeywords

    params = inspect.signature(asv.Supervisor).parameters.values()
    defaults = {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY}
    seen, in_flat = set(), set()
    for kind in (asv.CheckpointOptions, asv.SummaryOptions, asv.StopOptions):
        for f in dataclasses.fields(kind):
            flat = f.metadata["flat"]
            if flat in defaults:
                assert f.default == defaults[flat], (kind.__name__, f.name)
            elif not f.metadata.get("options_only"):  # e.g. ram_tier: no flat keyword at all
                in_flat.add(flat)
            seen.add(flat)
    assert len(seen) == 21  # 17 flat keywords; ram_tier, ram_save_secs, watchdog, stop_deadline_secs (options only)
    assert set(_FlatKeywords.__annotations__) == in_flat | {"clock"}


def test_the_front_door_is_narrow() -> None:
    """``Supervisor()`` takes at most 20 parameters (``**flat`` counts as one): the options
    objects carry a feature's settings."""
    params = inspect.signature(asv.Supervisor).parameters
    assert len(params) <= 20, list(params)
    assert list(params)[-1] == "flat" and params["flat"].kind is inspect.Parameter.VAR_KEYWORD


@pytest.mark.parametrize(
    ("keyword", "value", "field"),
    [
        ("checkpoint_basename", "weights", "checkpoint_basename"),
        ("save_model_steps", 7, "save_model_steps"),
        ("max_to_keep", None, "max_to_keep"),
        ("keep_checkpoint_every_n_hours", 1.5, "keep_checkpoint_every_n_hours"),
        ("checkpoint_when_busy", "skip", "checkpoint_when_busy"),
        ("checkpoint_staging", False, "checkpoint_staging"),
        ("checkpoint_store", "plain", "checkpoint_store"),
        ("stop_grace_secs", 9, "stop_grace_secs"),
        ("handle_signals", False, "handle_signals"),
    ],
)
def test_each_flat_keyword_reaches_the_config(tmp_path: Path, keyword: str, value: object, field: str) -> None:
    """A keyword given through ``**flat`` lands in ``sv.config`` as it did when it was in
    the signature, and equals its options object's spelling."""
    config = asv.Supervisor(tmp_path, **{keyword: value}).config  # type: ignore[arg-type]
    assert getattr(config, field) == value


@pytest.mark.parametrize(
    ("keyword", "message"),
    [
        ("xyz", "Supervisor() got an unexpected keyword argument 'xyz'"),
        ("max_to_kep", "Supervisor() got an unexpected keyword argument 'max_to_kep'; did you mean 'max_to_keep'?"),
        ("grace_secs", "did you mean stop_grace_secs= or stop=asv.StopOptions(grace_secs=...)?"),
    ],
)
def test_an_unknown_keyword_is_a_type_error_naming_it(keyword: str, message: str) -> None:
    """An unknown keyword is a ``TypeError`` naming it, with the closest known keyword
    (or, for an options field's name, its flat keyword and its group) as a hint."""
    with pytest.raises(TypeError) as info:
        asv.Supervisor(None, **{keyword: 1})  # type: ignore[arg-type]
    assert message in str(info.value)


def test_store_takes_a_name_or_an_object(tmp_path: Path) -> None:
    """``store="plain"`` is ``checkpoint_store="plain"`` (a different ``checkpoint_store``
    too is a ``ValueError`` naming both); a store object is the config's ``store`` (what
    it does: ``tests/checkpoint/test_ram_tier.py``)."""
    clock = ManualClock()
    named = asv.Supervisor(tmp_path, store="plain", clock=clock).config
    assert named == asv.Supervisor(tmp_path, checkpoint_store="plain", clock=clock).config
    with pytest.raises(ValueError, match=r"store='plain' and checkpoint_store='auto' disagree"):
        asv.Supervisor(tmp_path, store="plain", checkpoint_store="auto")
    with pytest.raises(ValueError, match="checkpoint_store must be one of"):
        asv.Supervisor(tmp_path, store="quick")
    from asupervisor._checkpoint.store import open_store

    store = open_store(tmp_path)
    sv = asv.Supervisor(tmp_path, store=store)
    assert sv.config.store is store and sv.config.checkpoint_store is None


# -- groups and flat keywords ------------------------------------------------------


def _config(tmp_path: Path, clock: ManualClock, **kwargs: Any) -> Any:
    return asv.Supervisor(tmp_path / "run", clock=clock, **kwargs).config


def test_groups_give_the_same_config_as_the_flat_keywords(tmp_path: Path) -> None:
    """``Supervisor(checkpoint=..., summaries=..., stop=...)`` builds exactly the config the
    flat keywords build."""
    clock = ManualClock()
    flat = _config(
        tmp_path,
        clock,
        save_model_secs=0,
        save_model_steps=50,
        max_to_keep=3,
        keep_checkpoint_every_n_hours=2.0,
        checkpoint_basename="weights",
        checkpoint_when_busy="skip",
        checkpoint_staging=False,
        checkpoint_store="plain",
        save_summaries_secs=30,
        stop_grace_secs=15,
        stop_signals=("SIGTERM", "SIGUSR1"),
        handle_signals=False,
    )
    grouped = _config(
        tmp_path,
        clock,
        checkpoint=asv.CheckpointOptions(
            save_secs=0,
            save_steps=50,
            max_to_keep=3,
            keep_every_n_hours=2.0,
            basename="weights",
            when_busy="skip",
            staging=False,
            store="plain",
        ),
        summaries=asv.SummaryOptions(save_secs=30),
        stop=asv.StopOptions(grace_secs=15, signals=("SIGTERM", "SIGUSR1"), handle_signals=False),
    )
    assert grouped == flat
    assert _config(tmp_path, clock) == _config(
        tmp_path, clock, checkpoint=asv.CheckpointOptions(), summaries=asv.SummaryOptions(), stop=asv.StopOptions()
    )


def test_policies_and_the_remote_settings_go_through_the_group(tmp_path: Path) -> None:
    """Policy objects and a URL logdir's settings travel in ``CheckpointOptions`` too."""
    clock = ManualClock()
    save, keep = asv.EverySteps(100), asv.LatestN(2)
    grouped = _config(tmp_path, clock, checkpoint=asv.CheckpointOptions(save_policy=save, keep_policy=keep))
    assert grouped == _config(tmp_path, clock, save_policy=save, keep_policy=keep)
    assert grouped.save_policy is save and grouped.keep_policy is keep
    remote = asv.CheckpointOptions(local_dir=tmp_path / "cache", upload_every=3, upload_every_secs=60)
    a = asv.Supervisor("memory://bucket/run", clock=clock, checkpoint=remote).config
    b = asv.Supervisor(
        "memory://bucket/run", clock=clock, local_dir=tmp_path / "cache", upload_every=3, upload_every_secs=60
    ).config
    assert a == b and a.upload_every == 3


def test_flat_keywords_and_groups_mix(tmp_path: Path) -> None:
    """A flat keyword for one setting and a group for others combine; the same value
    given both ways is no conflict."""
    clock = ManualClock()
    config = _config(
        tmp_path,
        clock,
        save_model_steps=10,
        stop_grace_secs=5,
        checkpoint=asv.CheckpointOptions(max_to_keep=2, save_steps=10),
    )
    assert (config.save_model_steps, config.max_to_keep, config.stop_grace_secs) == (10, 2, 5)


def test_a_setting_given_twice_with_different_values_is_an_error_naming_both(tmp_path: Path) -> None:
    """``save_model_secs=60`` with ``CheckpointOptions(save_secs=300)`` is a ``ValueError``
    naming the keyword, the group and both values."""
    clock = ManualClock()
    with pytest.raises(ValueError) as info:
        _config(tmp_path, clock, save_model_secs=60, checkpoint=asv.CheckpointOptions(save_secs=300))
    message = str(info.value)
    assert "save_model_secs=60" in message and "checkpoint=CheckpointOptions(save_secs=300)" in message
    with pytest.raises(ValueError, match=r"stop_signals=\('SIGTERM',\) and stop=StopOptions\(signals=\('SIGUSR1',\)\)"):
        _config(tmp_path, clock, stop_signals=("SIGTERM",), stop=asv.StopOptions(signals=("SIGUSR1",)))
    with pytest.raises(ValueError, match=r"save_summaries_secs=10 and summaries=SummaryOptions\(save_secs=20\)"):
        _config(tmp_path, clock, save_summaries_secs=10, summaries=asv.SummaryOptions(save_secs=20))


def test_a_group_of_the_wrong_type_is_a_type_error(tmp_path: Path) -> None:
    """``checkpoint=`` takes a ``CheckpointOptions`` (not a dict, not another group)."""
    clock = ManualClock()
    with pytest.raises(TypeError, match=r"checkpoint must be an asv.CheckpointOptions or None, got \{'save_secs': 5\}"):
        _config(tmp_path, clock, checkpoint={"save_secs": 5})
    with pytest.raises(TypeError, match=r"stop must be an asv\.StopOptions"):
        _config(tmp_path, clock, stop=asv.SummaryOptions())


@pytest.mark.anyio
async def test_a_session_runs_on_grouped_settings(tmp_path: Path) -> None:
    """The grouped settings reach the session: a checkpoint every 2 steps, named by the
    group's basename."""
    sv = asv.Supervisor(
        tmp_path,
        checkpoint=asv.CheckpointOptions(save_secs=0, save_steps=2, basename="weights"),
        summaries=asv.SummaryOptions(save_secs=0),
        stop=asv.StopOptions(handle_signals=False, grace_secs=30),
        clock=ManualClock(),
    )
    async with sv.managed_session() as sess:
        await sess.run_loop(lambda: None, max_steps=4)
    assert sv.status().last_checkpoint is not None
    assert Path(sv.status().last_checkpoint.path).name == "weights-4"


# -- the extension surface names public types only ---------------------------------


def _public_types() -> set[object]:
    return {getattr(asv, name) for name in asv.__all__ if inspect.isclass(getattr(asv, name))}


def _foreign(hint: object, public: set[object]) -> list[str]:
    """The types in ``hint`` that are neither public asupervisor types nor builtins,
    ``typing``, ``collections.abc`` or ``anyio`` ones."""
    if hint is None or hint is type(None) or hint is Any or hint is Ellipsis or isinstance(hint, typing.TypeVar):
        return []
    if isinstance(hint, (list, tuple)):  # Callable[[A, B], R]'s parameters
        return [t for h in hint for t in _foreign(h, public)]
    origin = typing.get_origin(hint)
    if origin is not None:
        found = [] if origin in (typing.Union, types.UnionType) else _foreign(origin, public)
        return found + [t for arg in typing.get_args(hint) for t in _foreign(arg, public)]
    module = getattr(hint, "__module__", "")
    if hint in public or module in ("builtins", "typing", "collections.abc") or module.split(".")[0] == "anyio":
        return []
    return [repr(hint)]


def _hints_of_protocol(cls: type) -> dict[str, object]:
    """Every annotation of ``cls``'s own members: attributes, properties, methods."""
    hints: dict[str, object] = {f"{cls.__name__}.{k}": v for k, v in typing.get_type_hints(cls).items()}
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        fn = member.fget if isinstance(member, property) else member
        if inspect.isfunction(fn):
            for arg, hint in typing.get_type_hints(fn).items():
                hints[f"{cls.__name__}.{name}:{arg}"] = hint
    return hints


def test_service_context_names_only_public_types() -> None:
    """What a service sees (``ServiceContext``, and ``WorkerThread`` it hands out, and
    ``Service.run``) is typed with public names only: no engine type leaks."""
    public = _public_types()
    hints = {}
    for cls in (asv.ServiceContext, asv.WorkerThread):
        hints.update(_hints_of_protocol(cls))
    hints.update({f"Service.run:{k}": v for k, v in typing.get_type_hints(asv.Service.run).items()})
    assert "ServiceContext.new_thread:return" in hints and "ServiceContext.clock:return" in hints
    leaks = {name: found for name, hint in hints.items() if (found := _foreign(hint, public))}
    assert not leaks, leaks


def test_the_leak_check_sees_a_private_type() -> None:
    """The check above fails on an engine type, so its silence means something."""
    from asupervisor._core._threads import DedicatedThread

    public = _public_types()
    assert _foreign(DedicatedThread, public) == [repr(DedicatedThread)]
    assert _foreign(DedicatedThread | None, public) == [repr(DedicatedThread)]
    assert _foreign(typing.Callable[[DedicatedThread], int], public) == [repr(DedicatedThread)]
    assert _foreign(asv.Clock | None, public) == []


@pytest.mark.anyio
async def test_a_service_uses_the_public_context(tmp_path: Path) -> None:
    """A service does its work through the public context only: a worker thread, the
    step thread, its state in ``status()``, and a stop request with a reason."""
    seen: dict[str, Any] = {}

    class Watcher(asv.Service):
        name = "watcher"

        async def run(self, ctx: asv.ServiceContext, *, task_status: Any) -> None:
            thread = ctx.new_thread("asv-watcher")
            seen["thread"] = await thread.run(lambda: __import__("threading").current_thread().name)
            task_status.started()
            ctx.set_service_state(self.name, "watching")
            seen["step"] = await ctx.run_on_step_thread(lambda: ctx.global_step)
            seen["before"] = ctx.should_stop()
            await thread.aclose()
            ctx.request_stop(reason="preempted:watcher")
            seen["reason"] = ctx.stop_reason
            await anyio.sleep_forever()

    sv = asv.Supervisor(None, handle_signals=False, save_summaries_secs=0, clock=ManualClock())
    sv.add_service(Watcher())
    async with sv.managed_session():
        await anyio.sleep_forever()
    assert seen == {"thread": "asv-watcher", "step": 0, "before": False, "reason": "preempted:watcher"}
    assert asv.exit_code(sv.status()) == 143


@pytest.mark.anyio
async def test_an_error_in_a_fire_and_forget_job_stops_the_session() -> None:
    """``WorkerThread.submit_nowait``: what ``fn`` raises stops the session and comes out of
    ``managed_session()`` as itself."""

    class Bad(asv.Service):
        name = "bad"

        async def run(self, ctx: asv.ServiceContext, *, task_status: Any) -> None:
            task_status.started()

            def fail() -> None:
                raise LookupError("gone")

            ctx.new_thread("asv-bad").submit_nowait(fail)
            await anyio.sleep_forever()

    sv = asv.Supervisor(None, handle_signals=False, save_summaries_secs=0, clock=ManualClock())
    sv.add_service(Bad())
    with pytest.raises(LookupError, match="gone"):
        async with sv.managed_session():
            await anyio.sleep_forever()
    assert sv.status().stop_reason == "service:bad"
