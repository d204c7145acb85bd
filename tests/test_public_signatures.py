"""No private type in a public signature.

Every name in ``asupervisor.__all__`` is walked: a function's annotations, and a class's
``__init__``, public methods and properties (its own and those it inherits from the
package's code). Each annotation is resolved as a type checker would (imports under
``if TYPE_CHECKING:`` included) and every type it names must be one a user can name too:
a public ``asupervisor.<Name>``, or a type of Python (builtins, ``typing``,
``collections.abc``, ``os``, ``pathlib``, ...) or of a library the user already has
(``anyio``, ``tensorflow``, ``keras``, ``numpy``). An engine type in a signature
(``Engine``, ``ThreadSafeClock``) would force users onto private names to type their own
code, and would tie the private module's layout to the public API.
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import typing_extensions

import asupervisor as asv

#: the modules (by their top-level package) whose types a public signature may name
OUTSIDE = frozenset(
    {
        "abc",
        "anyio",
        "builtins",
        "collections",
        "contextlib",
        "datetime",
        "enum",
        "keras",
        "logging",
        "numpy",
        "os",
        "pathlib",
        "signal",
        "tensorflow",
        "types",
        "typing",
        "typing_extensions",
    }
)


def _public() -> set[int]:
    return {id(getattr(asv, name)) for name in asv.__all__}


@functools.cache
def _type_checking_names(module_name: str) -> dict[str, Any]:
    """What ``module_name``'s ``if TYPE_CHECKING:`` imports bind, imported now."""
    module = sys.modules[module_name]
    tree = ast.parse(inspect.getsource(module))
    namespace: dict[str, Any] = {"__name__": module_name, "__package__": module.__package__}
    for node in ast.walk(tree):  # at the top level or in an ``elif`` (``sys.version_info``)
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            imports = [n for n in node.body if isinstance(n, (ast.Import, ast.ImportFrom))]
            exec(compile(ast.Module(body=imports, type_ignores=[]), module_name, "exec"), namespace)
    return namespace


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """``fn``'s annotations, resolved in its module with its type-only imports."""
    module_name = fn.__globals__["__name__"]
    namespace = {**fn.__globals__, **_type_checking_names(module_name)}
    return typing.get_type_hints(fn, globalns=namespace)


def _functions_of(obj: object) -> Iterator[tuple[str, Callable[..., Any]]]:
    """The public callables of a name in ``__all__``: itself (a function), or a class's
    ``__init__``, public methods and property getters written in the package."""
    if inspect.isfunction(obj):
        yield obj.__name__, obj
        return
    assert inspect.isclass(obj), obj
    for attr in dir(obj):
        if attr.startswith("_") and attr != "__init__":
            continue
        member = inspect.getattr_static(obj, attr)
        if isinstance(member, (classmethod, staticmethod)):
            member = member.__func__
        elif isinstance(member, property):
            member = member.fget
        if inspect.isfunction(member) and member.__globals__["__name__"].split(".")[0] == "asupervisor":
            yield f"{obj.__name__}.{attr}", member


def _private_types(hint: object, public: set[int]) -> list[str]:
    """The types named in ``hint`` that a user could not name."""
    if hint is None or hint is type(None) or hint is Any or hint is Ellipsis or isinstance(hint, typing.TypeVar):
        return []
    if isinstance(hint, (list, tuple)):  # Callable[[A, B], R]'s parameters
        return [t for h in hint for t in _private_types(h, public)]
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return []
    if origin in (typing_extensions.Unpack, getattr(typing, "Unpack", None)):
        # ``**kwargs: Unpack[SomeKeywords]``: the signature is the keywords, each typed
        (keywords,) = typing.get_args(hint)
        return [t for h in typing.get_type_hints(keywords).values() for t in _private_types(h, public)]
    if origin is not None:
        found = [] if origin in (typing.Union, types.UnionType) else _private_types(origin, public)
        return found + [t for arg in typing.get_args(hint) for t in _private_types(arg, public)]
    if id(hint) in public or getattr(hint, "__module__", "").split(".")[0] in OUTSIDE:
        return []
    return [repr(hint)]


def private_types_in_public_signatures() -> dict[str, list[str]]:
    """``{"Name.method:argument": [private type, ...]}`` over everything in ``__all__``."""
    public = _public()
    found: dict[str, list[str]] = {}
    for name in asv.__all__:
        for where, fn in _functions_of(getattr(asv, name)):
            for arg, hint in _hints(fn).items():
                if private := _private_types(hint, public):
                    found[f"{where}:{arg}"] = private
    return found


def test_public_signatures_name_public_types_only() -> None:
    """No function or class in ``asupervisor.__all__`` names a private type in the
    signature of its ``__init__``, its public methods or its properties."""
    assert private_types_in_public_signatures() == {}


def test_the_walk_reaches_what_it_checks() -> None:
    """The walk sees constructors, methods, properties and ``**keywords``: its silence
    above means something."""
    walked = {where for name in asv.__all__ for where, _ in _functions_of(getattr(asv, name))}
    assert {"Supervisor.__init__", "Supervisor.managed_session", "Session.fit", "Session.global_step"} <= walked
    assert {"StepCounterHook.__init__", "exit_code", "watch_checkpoints"} <= walked
    hints = _hints(asv.Supervisor.__init__)
    assert hints["flat"] is not None and typing.get_origin(hints["flat"]) is not None


def test_the_check_sees_a_private_type() -> None:
    """Fed an engine type, bare or inside a union, a ``Callable``, a generic or the
    keywords of an ``Unpack``, the check reports it; public and outside types it passes."""
    from asupervisor._core._threads import DedicatedThread

    public = _public()
    for hint in (
        DedicatedThread,
        DedicatedThread | None,
        Callable[[DedicatedThread], int],
        list[DedicatedThread],
    ):
        assert _private_types(hint, public) == [repr(DedicatedThread)], hint

    Keywords = typing.TypedDict("Keywords", {"thread": DedicatedThread, "clock": asv.Clock}, total=False)  # noqa: UP013
    assert _private_types(typing_extensions.Unpack[Keywords], public) == [repr(DedicatedThread)]
    for fine in (asv.Clock | None, Callable[[asv.Session], Any], dict[str, list[float]], typing.Literal["min"]):
        assert _private_types(fine, public) == [], fine


@pytest.mark.parametrize("name", ["Session", "StepContext"])
def test_sessions_are_not_made_by_users(name: str) -> None:
    """``Session`` and ``StepContext`` come from the engine (``managed_session()``,
    ``run_step_fn``); calling the class is a ``TypeError`` that says where they come from."""
    with pytest.raises(TypeError, match="managed_session"):
        getattr(asv, name)()
