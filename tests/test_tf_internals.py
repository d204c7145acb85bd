"""TensorFlow's and Keras's private names: all in ``asupervisor/_tf_internals.py``, each
resolving on the installed TensorFlow, each with a fallback that works when it is gone.

A TensorFlow upgrade that removes or renames one is simulated with
``_tf_internals.hide(name)`` (the module then sees it missing, as it would be), and for
the protocol-buffer modules also by removing the module itself (``sys.modules[name] =
None``): a real save (snapshot, write, three times: the walk cache too) and a real
restore into new objects must still give back every value, or, for a name without a
fallback, fail with a ``CheckpointError`` naming the TensorFlow version and the name.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from _timing import scaled

import asupervisor
from asupervisor import CheckpointError, _tf_internals
from asupervisor._tf_internals import INTERNALS

PACKAGE = Path(asupervisor.__file__).resolve().parent
NAMES = [entry.name for entry in INTERNALS]
NO_FALLBACK = {entry.name for entry in INTERNALS if entry.fallback.startswith("none")}


def test_the_registry_lists_each_name_once_with_a_fallback_and_the_docstring_names_them() -> None:
    assert len(NAMES) == len(set(NAMES))
    doc = _tf_internals.__doc__ or ""
    for entry in INTERNALS:
        assert entry.used_for and entry.fallback, entry.name
        assert entry.name.rsplit(".", 1)[-1] in doc, f"{entry.name} is not in the module's docstring"


@pytest.mark.parametrize("name", NAMES)
def test_each_private_name_resolves_on_the_installed_tensorflow(name: str) -> None:
    assert _tf_internals.resolves(name), f"TensorFlow {tf.__version__} has no {name}: its fallback is in use"


def _private_uses(path: Path) -> list[str]:
    """The TF/Keras private names ``path`` uses in code (docstrings and comments aside):
    attributes, ``getattr`` strings and imports of ``tensorflow.python``/``tensorflow.core``."""
    private = {entry.name.rsplit(".", 1)[-1] for entry in INTERNALS if "." in entry.name}
    private = {name for name in private if name.startswith("_")}
    private |= {"_saver", "_graph_view", "_gather_serialized_tensors", "_breadth_first_traversal", "_delete_tracking"}
    found = []
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in private:
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):  # our own attributes
                found.append(f"{path.name}:{node.lineno}: .{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in private
        ):
            found.append(f"{path.name}:{node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for module in modules:
                if module.startswith(("tensorflow.python", "tensorflow.core", "tensorflow.compiler", "keras.src")):
                    found.append(f"{path.name}:{node.lineno}: import {module}")
    return found


def test_no_other_module_uses_a_private_name() -> None:
    found = [
        use for path in sorted(PACKAGE.rglob("*.py")) if path.name != "_tf_internals.py" for use in _private_uses(path)
    ]
    assert not found, "TF private names outside asupervisor/_tf_internals.py:\n" + "\n".join(found)
    assert _private_uses(PACKAGE / "_tf_internals.py"), "the check finds nothing at all"


# ---------------------------------------------------------------------------------------
# each name hidden in turn


def _build() -> tuple[Any, Any, Any, Any]:
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dropout(0.5)])
    opt = keras.optimizers.Adam()
    plain = tf.Variable([1.0, 2.0])
    data = tf.data.Dataset.range(10).batch(2)
    return model, opt, plain, data


def _train(model: Any, opt: Any) -> None:
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(tf.ones((1, 3)), training=True))
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))


def _save_and_restore(tmp_path: Path) -> None:
    """Three saves by the library's checkpointer, then a restore into new objects."""
    from asupervisor._checkpoint._manager import Checkpointer
    from asupervisor._checkpoint.store import restore_path

    model, opt, plain, data = _build()
    _train(model, opt)
    iterator = iter(data)
    next(iterator)
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt, plain=plain, it=iterator)
    checkpointer = Checkpointer(ckpt, tmp_path / "logdir")
    checkpointer.prepare()
    info = None
    for step in (1, 2, 3):
        plain.assign_add([1.0, 1.0])
        _train(model, opt)
        snap = checkpointer.snapshot(step)
        assert snap is not None
        info = checkpointer.write(snap)
    assert info is not None

    model2, opt2, plain2, data2 = _build()
    model2(tf.ones((1, 3)))
    iterator2 = iter(data2)
    ckpt2 = tf.train.Checkpoint(model=model2, optimizer=opt2, plain=plain2, it=iterator2)
    restore_path(ckpt2, info.path)
    np.testing.assert_array_equal(plain2.numpy(), plain.numpy())
    for a, b in zip(model.weights, model2.weights):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(next(iterator2).numpy(), next(iterator).numpy())
    assert int(ckpt2.save_counter.numpy()) == 3
    _train(model2, opt2)  # the optimizer's deferred slots restore at its first step
    assert int(opt2.iterations.numpy()) == int(opt.iterations.numpy()) + 1


def _other_uses(name: str) -> None:
    """What the name serves outside a save and restore, with it hidden."""
    from asupervisor import _config, _keras
    from asupervisor._checkpoint.snapshot import _iterator_state, _iterator_tracking

    model, _, plain, data = _build()
    if name == _tf_internals.CHILDREN:
        ckpt = tf.train.Checkpoint(model=model, v=plain)
        assert _tf_internals.is_trackable(ckpt) and _tf_internals.is_trackable(plain)
        assert not _tf_internals.is_trackable([1, 2])
        assert set(_tf_internals.trackable_children(ckpt)) >= {"model", "v"}
        with pytest.raises(TypeError, match=r"state\['x'\]"):
            _config.check_state_values({"x": [1, 2]})
    elif name == _tf_internals.SERIALIZE:
        assert _iterator_state.serialisation_problem(iter(data)) is None
    elif name == _tf_internals.DEPENDENCIES:
        ckpt = tf.train.Checkpoint(v=plain, w=tf.Variable(2.0))
        _iterator_tracking._untrack(ckpt, "w")
        assert "w" not in _tf_internals.trackable_children(ckpt)
    elif name in (_tf_internals.DATASET_INPUTS, _tf_internals.DATASET_BATCH):
        assert "elements" in _iterator_state.describe_pipeline(data.map(lambda x: x + 1))
    elif name == _tf_internals.CONTEXT:
        assert _tf_internals.coordination_service_context() is None
    elif name == _tf_internals.KERAS_BUILD:
        model.compile(optimizer="adam", loss="mse")
        _keras._build(model, tf.data.Dataset.from_tensors((tf.ones((1, 3)), tf.ones((1, 2)))))
    elif name == _tf_internals.KERAS_DATA:  # arrays refused, naming the Keras version
        x, y = np.ones((4, 3), "float32"), np.ones((4, 2), "float32")
        inputs = _keras._Inputs(x, y, None, 2, True, None, None, 0.0, None, None, None)
        with pytest.raises(ValueError, match=r"keras 3\.\d+.*pass a tf\.data\.Dataset"):
            inputs.prepare(None)
    elif name == _tf_internals.COORDINATOR:  # TF's own warnings then, nothing failing
        try:
            tf.train.Checkpoint(v=plain).restore(str(Path("/nonexistent") / "ckpt"))
        except (tf.errors.OpError, ValueError) as exc:
            _tf_internals.quiet_failed_restore(exc.__traceback__)
    elif name in (_tf_internals.KERAS_LAYERS, _tf_internals.KERAS_SEEDS):
        found = _tf_internals.keras_seed_generators(model)
        assert len(found) == 1 and type(found[0]).__name__ == "SeedGenerator"


def _names_in_error(exc: BaseException) -> str:
    texts = []
    seen: BaseException | None = exc
    while seen is not None:
        texts.append(str(seen))
        seen = seen.__cause__ or seen.__context__
    return "\n".join(texts)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", NAMES)
def test_each_fallback_works_or_fails_naming_the_tensorflow_version(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if name in NO_FALLBACK:  # a module: gone for real, as after an upgrade that moved it
        monkeypatch.setitem(sys.modules, name, None)
    with _tf_internals.hide(name):
        error: CheckpointError | None = None
        try:
            _save_and_restore(tmp_path)
        except CheckpointError as exc:
            error = exc
        if error is None:
            _other_uses(name)
    if error is not None:
        assert name in NO_FALLBACK, f"{name} has a fallback, yet: {error}"
        text = _names_in_error(error)
        assert f"TensorFlow {tf.__version__}" in text and name in text, text


def test_a_module_another_thread_is_still_loading_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two step threads (two sessions in one process) ask for a protocol-buffer module at
    once: the second gets it whole, not half-initialised (``sys.modules`` holds a module
    from the moment its loading begins; ``partially initialized module ... has no
    attribute``, seen in two trio jobs restoring side by side)."""
    import threading

    started, release = threading.Event(), threading.Event()
    (tmp_path / "asv_slow_proto.py").write_text(
        "import builtins\nbuiltins._asv_slow_started.set()\nbuiltins._asv_slow_release.wait(60)\nX = 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import builtins

    monkeypatch.setattr(builtins, "_asv_slow_started", started, raising=False)
    monkeypatch.setattr(builtins, "_asv_slow_release", release, raising=False)
    monkeypatch.delitem(sys.modules, "asv_slow_proto", raising=False)
    seen: list[bool] = []
    second_done = threading.Event()

    def second() -> None:
        seen.append(hasattr(_tf_internals._module("asv_slow_proto"), "X"))
        second_done.set()

    first = threading.Thread(target=lambda: _tf_internals._module("asv_slow_proto"))
    first.start()
    assert started.wait(scaled(60))
    other = threading.Thread(target=second)
    other.start()
    # the second must not come back while the first is still loading it (it waits for it)
    came_back_early = second_done.wait(0.5)
    release.set()
    first.join(scaled(60))
    other.join(scaled(60))
    assert not came_back_early and seen == [True], seen
    sys.modules.pop("asv_slow_proto", None)


def test_a_failed_restore_leaves_no_tensorflow_warnings(tmp_path: Path) -> None:
    """A checkpoint whose kernel's bytes were damaged fails TF's own restore (it holds an
    iterator, so TF restores it): the ``DataLossError`` is raised, and once the failed
    restore is freed TF's logger has said nothing ("Value in checkpoint could not be
    found" for each value), the caller having reported it; the optimizer's values stay
    unrestored, so TF would have warned."""
    import gc
    import logging

    from asupervisor._checkpoint.store import restore_path

    model, opt, plain, data = _build()
    _train(model, opt)
    iterator = iter(data)
    prefix = tf.train.Checkpoint(model=model, optimizer=opt, plain=plain, it=iterator).write(str(tmp_path / "ckpt"))
    kernel = model.layers[0].kernel.numpy().tobytes()
    for shard in tmp_path.glob("ckpt.data-*"):
        raw = bytearray(shard.read_bytes())
        at = raw.find(kernel)
        if at >= 0:
            raw[at + len(kernel) // 2] ^= 0xFF
            shard.write_bytes(bytes(raw))
            break
    else:
        pytest.fail("the kernel's bytes are in no data file")

    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    tf_logger = logging.getLogger("tensorflow")
    tf_logger.addHandler(handler)
    try:
        model2, opt2, plain2, data2 = _build()
        model2(tf.ones((1, 3)))
        ckpt2 = tf.train.Checkpoint(model=model2, optimizer=opt2, plain=plain2, it=iter(data2))
        with pytest.raises(tf.errors.DataLossError):
            restore_path(ckpt2, prefix)
        gc.collect()
    finally:
        tf_logger.removeHandler(handler)
    assert not [line for line in said if "checkpoint" in line.lower()], said
