"""The public surface: names, docstrings, and a cheap, side-effect-free import."""

from __future__ import annotations

import inspect
import pickle
import subprocess
import sys
import types

import asupervisor as asv


def test_all_is_sorted_and_complete() -> None:
    """__all__ is sorted and every name in it exists."""
    assert list(asv.__all__) == sorted(asv.__all__)
    for name in asv.__all__:
        assert hasattr(asv, name), name


def _export_problems(module: types.ModuleType) -> list[str]:
    """What is wrong with ``module``'s exports: a public class or function of the package
    missing from ``__all__``, a name in ``__all__`` that is not such an object, or one that
    reports another module than ``module`` (in reprs, tracebacks and pickles)."""
    problems = []
    exported = set(module.__all__)
    for name, obj in vars(module).items():
        if name.startswith("_") or isinstance(obj, types.ModuleType):
            continue
        if type(obj).__module__ == "__future__":  # ``from __future__ import annotations``
            continue
        if name not in exported:
            problems.append(f"{name}: public but not in __all__")
    for name in module.__all__:
        obj = getattr(module, name, None)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            problems.append(f"{name}: in __all__ but not a class or function")
        elif obj.__module__ != module.__name__ or obj.__qualname__ != name:
            problems.append(f"{name}: reports itself as {obj.__module__}.{obj.__qualname__}")
    return problems


def test_all_lists_every_public_object_and_nothing_else() -> None:
    """``__all__`` of ``asupervisor`` names every public class and function it exposes and
    nothing else, and each reports ``__module__ == "asupervisor"`` under its own name."""
    assert _export_problems(asv) == []


def test_export_check_sees_each_kind_of_problem() -> None:
    """The export check finds a public name missing from ``__all__``, a name in ``__all__``
    that is not a class or function, and an object reporting its private module."""
    module = types.ModuleType("asupervisor_fake")

    class Reported:
        pass

    class Private:
        pass

    Reported.__module__, Reported.__qualname__ = "asupervisor_fake", "Reported"
    Private.__module__, Private.__qualname__ = "asupervisor_fake._private", "Private"
    module.Reported, module.Private, module.Unlisted, module.VALUE = Reported, Private, Reported, 3
    module.__all__ = ["Private", "Reported", "VALUE"]
    assert sorted(_export_problems(module)) == [
        "Private: reports itself as asupervisor_fake._private.Private",
        "Unlisted: public but not in __all__",
        "VALUE: in __all__ but not a class or function",
    ]


def test_public_objects_pickle_by_their_public_name() -> None:
    """Each class and function in ``__all__`` pickles as a reference that loads back to
    itself, and an exception raised by the library survives a round trip with its message:
    reporting ``asupervisor`` as their module does not break pickling."""
    for name in asv.__all__:
        obj = getattr(asv, name)
        assert pickle.loads(pickle.dumps(obj)) is obj, name
    error = pickle.loads(pickle.dumps(asv.CheckpointError("logdir /x cannot be written")))
    assert type(error) is asv.CheckpointError
    assert str(error) == "logdir /x cannot be written"
    assert repr(asv.Supervisor) == "<class 'asupervisor.Supervisor'>"


def _undocumented(module: object, names: list[str]) -> list[str]:
    """Public names of ``module`` without a docstring, and public members of its classes
    (methods, async methods, class/static methods, properties) without one, including
    members a class inherits from a private base (what users see on the class)."""
    import functools

    missing = []
    for name in names:
        obj = getattr(module, name)
        if not inspect.getdoc(obj):
            missing.append(name)
        if not inspect.isclass(obj):
            continue
        seen: set[str] = set()
        for klass in obj.__mro__:
            if klass is object or not klass.__module__.startswith("asupervisor"):
                continue
            for attr, member in vars(klass).items():
                if attr.startswith("_") or attr in seen:
                    continue
                seen.add(attr)
                fn = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
                if not (inspect.isfunction(fn) or isinstance(fn, (property, functools.cached_property))):
                    continue
                # an override documented only on its public base is documented (getdoc)
                if not inspect.getdoc(getattr(obj, attr, fn)) and not (fn.__doc__ or "").strip():
                    missing.append(f"{name}.{attr}")
    return missing


def test_every_public_name_has_a_docstring() -> None:
    """Every public class and function of ``asupervisor`` and ``asupervisor.testing``, and
    every public method and property of those classes, are documented."""
    import asupervisor.testing

    missing = _undocumented(asv, list(asv.__all__)) + [
        f"testing.{n}" for n in _undocumented(asupervisor.testing, list(asupervisor.testing.__all__))
    ]
    assert not missing, f"undocumented: {missing}"


def test_docstring_check_sees_every_kind_of_member() -> None:
    """The docstring check finds an undocumented function, method, async method,
    class/static method, property, and a method inherited from a private base."""
    import types

    class _Base:
        def inherited(self) -> None:
            pass

    class Public(_Base):
        """Documented."""

        def method(self) -> None:
            pass

        async def amethod(self) -> None:
            pass

        @classmethod
        def cmethod(cls) -> None:
            pass

        @staticmethod
        def smethod() -> None:
            pass

        @property
        def prop(self) -> int:
            return 1

        def _private(self) -> None:
            pass

    def function() -> None:
        pass

    for obj in (_Base, Public):
        obj.__module__ = "asupervisor._fake"
    module = types.SimpleNamespace(Public=Public, function=function)
    assert sorted(_undocumented(module, ["Public", "function"])) == sorted(
        [
            "function",
            "Public.method",
            "Public.amethod",
            "Public.cmethod",
            "Public.smethod",
            "Public.prop",
            "Public.inherited",
        ]
    )


def test_import_does_not_import_tensorflow_or_configure_logging() -> None:
    """Importing asupervisor imports no TensorFlow and leaves structlog unconfigured."""
    code = (
        "import sys, structlog; before = structlog.is_configured(); import asupervisor;"
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported';"
        "assert structlog.is_configured() == before, 'logging configured'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_library_never_uses_pooled_threads() -> None:
    """The library starts only threads it joins: no anyio/trio thread pools, no executors
    except ones used as a ``with`` block (whose exit joins their threads)."""
    import re
    from pathlib import Path

    package = Path(asv.__file__).parent
    offenders = []
    for path in package.rglob("*.py"):
        text = path.read_text()
        for needle in ("to_thread", "run_in_executor"):
            if needle in text:
                offenders.append(f"{path.name}: {needle}")
        for line in text.splitlines():
            if re.search(r"ThreadPoolExecutor\(", line) and not line.strip().startswith("with "):
                offenders.append(f"{path.name}: {line.strip()}")
    assert not offenders
