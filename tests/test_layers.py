"""The layer rule written at the top of ``asupervisor/__init__.py``, checked on the source.

Every module of the package is parsed (nothing is imported) and each of its imports of
the package — module level, in functions, under ``if TYPE_CHECKING:`` alike — is checked:

1. leaves (``_exceptions``, ``_tf``, ``_cluster``, ``_logging``) import nothing of ours but
   ``_exceptions``;
2. ``_core`` imports leaves and itself, never a feature nor a front door;
3. a feature (any other subpackage: ``_checkpoint``, ``_summary``, ``_input``,
   ``_basic_hooks``, ...) imports ``_core``, leaves and itself, never another feature nor
   a front door;
4. front doors (the other top-level modules) import anything but ``__init__``;
   ``_assembly`` is the only one naming a feature's session part;
5. ``__init__`` only re-exports.

And there is no import circle between modules, type-only imports included.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

import pytest

import asupervisor

# Parsing is a second's work, but on 2 cores busy with the suite's child processes a
# worker can wait far longer for a CPU: a stuck checker is still caught, later.
pytestmark = pytest.mark.timeout(240)

PACKAGE = Path(asupervisor.__file__).resolve().parent
LEAVES = {"_exceptions", "_tf", "_tf_internals", "_cluster", "_logging"}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted under the package ("_core._runtime")
    target: str  # the imported module, dotted under the package ("_checkpoint._part")
    line: int


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts)


def _resolve(root: Path, name: str) -> str:
    """The module a dotted name under the package refers to (a package's ``__init__``)."""
    if (root / Path(*name.split("."))).is_dir():
        return f"{name}.__init__" if name else "__init__"
    return name


@functools.cache
def imports_of(root: Path, package: str = "asupervisor") -> tuple[Import, ...]:
    """Every import of the package by its own modules (parsed once per root: the tests
    below share one parse, so none of them pays it again on a loaded machine)."""
    found: list[Import] = []
    for path in sorted(root.rglob("*.py")):
        mod = module_name(root, path)
        pkg_parts = mod.split(".")[:-1]
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg_parts[: len(pkg_parts) - (node.level - 1)] if node.level > 1 else pkg_parts
                    if node.level - 1 > len(pkg_parts):
                        continue
                    prefix = ".".join(base + ([node.module] if node.module else []))
                elif node.module and (node.module == package or node.module.startswith(package + ".")):
                    prefix = node.module[len(package) + 1 :] if node.module != package else ""
                else:
                    continue
                for alias in node.names:
                    candidate = f"{prefix}.{alias.name}" if prefix else alias.name
                    is_module = (root / Path(*candidate.split("."))).with_suffix(".py").exists() or (
                        root / Path(*candidate.split("."))
                    ).is_dir()
                    targets.append(candidate if is_module else prefix)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith(package + "."):
                        targets.append(alias.name[len(package) + 1 :])
            for target in dict.fromkeys(targets):
                found.append(Import(mod, _resolve(root, target), node.lineno))
    return tuple(found)


def layer_of(module: str) -> str:
    """``leaf``, ``core``, ``feature:<name>``, ``front`` or ``init``."""
    top = module.split(".")[0]
    if module == "__init__":
        return "init"
    if top in LEAVES:
        return "leaf"
    if top == "_core":
        return "core"
    if "." in module:  # a subpackage other than _core
        return f"feature:{top}"
    return "front"


def violations(root: Path) -> list[str]:
    """Imports breaking the layer rule (see the module docstring), one line each."""
    problems = []
    for imp in imports_of(root):
        src, dst = layer_of(imp.module), layer_of(imp.target)
        where = f"{imp.module.replace('.', '/')}.py:{imp.line} imports {imp.target}"
        if imp.target.split(".")[0] == imp.module.split(".")[0] and src != "front":
            continue  # within one package (or a leaf importing itself)
        if src == "leaf" and imp.target != "_exceptions":
            problems.append(f"{where}: a leaf imports only _exceptions")
        elif src == "core" and dst not in ("core", "leaf"):
            problems.append(f"{where}: _core imports leaves and itself only")
        elif src.startswith("feature:") and dst not in ("core", "leaf"):
            problems.append(f"{where}: a feature imports _core and leaves only")
        elif src == "front" and dst == "init":
            problems.append(f"{where}: nothing imports the package's __init__")
        elif src == "front" and imp.module != "_assembly" and imp.target.endswith("._part"):
            problems.append(f"{where}: only _assembly names a feature's session part")
    return problems


def cycles(root: Path) -> list[list[str]]:
    """Import circles between modules (type-only imports included)."""
    graph: dict[str, set[str]] = {}
    for imp in imports_of(root):
        if imp.target != imp.module:
            graph.setdefault(imp.module, set()).add(imp.target)
    found: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_the_package_keeps_its_layers() -> None:
    """No module of asupervisor imports across the layer rule."""
    assert violations(PACKAGE) == []


def test_no_import_circles() -> None:
    """No import circle between asupervisor's modules, type-only imports included."""
    assert cycles(PACKAGE) == []


def test_init_only_re_exports() -> None:
    """``__init__`` imports names as ``X as X`` and lists them in a sorted ``__all__``."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level:
            for alias in node.names:
                assert alias.asname == alias.name, f"__init__ line {node.lineno}: import {alias.name} as {alias.name}"
    assert asupervisor.__all__ == sorted(asupervisor.__all__)


def test_the_rule_is_written_where_a_newcomer_looks() -> None:
    """The docstring of ``asupervisor/__init__.py`` states the layers and names this test."""
    doc = asupervisor.__doc__ or ""
    for word in ("leaves", "_core", "features", "front doors", "tests/test_layers.py"):
        assert word in doc


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"_core/_engine.py": "from .._checkpoint import _part\n"}, "_core imports leaves and itself only"),
        ({"_summary/_writer.py": "from .._checkpoint._part import X\n"}, "a feature imports _core and leaves only"),
        ({"_summary/_writer.py": "from .. import _supervisor\n"}, "a feature imports _core and leaves only"),
        ({"_logging.py": "from ._core import _stop\n"}, "a leaf imports only _exceptions"),
        ({"_supervisor.py": "from ._checkpoint._part import CheckpointPart\n"}, "only _assembly names"),
        ({"_core/_engine.py": "def f():\n    import asupervisor._input._queue\n"}, "_core imports leaves"),
    ],
)
def test_the_checker_finds_each_kind_of_violation(tmp_path: Path, files: dict[str, str], expected: str) -> None:
    """Fed a small package with one known violation, the checker reports it."""
    for name in (
        "__init__.py",
        "_core/__init__.py",
        "_checkpoint/__init__.py",
        "_summary/__init__.py",
        "_input/__init__.py",
        "_checkpoint/_part.py",
        "_input/_queue.py",
        "_core/_stop.py",
        "_supervisor.py",
        "_logging.py",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = violations(tmp_path)
    assert any(expected in problem for problem in found), found


def test_the_checker_finds_a_type_only_circle(tmp_path: Path) -> None:
    """A circle made of a runtime import and a ``TYPE_CHECKING`` import is found."""
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "_a.py").write_text("from ._b import B\n")
    (tmp_path / "_b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._a import A\n")
    assert cycles(tmp_path) == [["_a", "_b", "_a"]]


def test_features_never_reach_into_the_engine() -> None:
    """No feature touches ``session._rt`` (the engine behind a session): they use
    ``context_of(session)``, the narrow ``SessionContext``."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(PACKAGE, path)
        if not layer_of(module).startswith("feature:"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "_rt":
                offenders.append(f"{module}:{node.lineno}")
    assert offenders == []


#: the optional stores: imported by no module outside them at module level
OPTIONAL_STORES = ("_checkpoint.store.fast", "_checkpoint.store.memory", "_checkpoint.store.remote")


def _module_level_lines(tree: ast.Module) -> set[int]:
    """The lines of the imports a module runs when it is imported: at its top level, in
    top-level ``try``/``if``/``with`` blocks, but not under ``if TYPE_CHECKING:``."""
    lines: set[int] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                lines.add(node.lineno)
            elif isinstance(node, ast.If):
                if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.With):
                visit(node.body)

    visit(tree.body)
    return lines


def eager_optional_imports(root: Path) -> list[str]:
    """Module-level imports of an optional store by a module outside it."""
    found = []
    for path in sorted(root.rglob("*.py")):
        module = module_name(root, path)
        eager = _module_level_lines(ast.parse(path.read_text(), str(path)))
        for imp in imports_of(root):
            if imp.module != module or imp.line not in eager:
                continue
            for store in OPTIONAL_STORES:
                inside = module == store or module.startswith(store + ".")
                if not inside and (imp.target == store + ".__init__" or imp.target.startswith(store + ".")):
                    found.append(f"{module}:{imp.line} imports {imp.target} when it is imported")
    return found


def test_the_optional_stores_are_imported_only_when_used() -> None:
    """``store/fast/`` and ``store/remote/`` are optional code: no module outside them
    imports them at module level (a function imports them when their store is chosen;
    type-only imports are free), so ``import asupervisor`` and the plain store work
    without them (``tests/checkpoint/test_optional_stores.py`` runs that)."""
    assert eager_optional_imports(PACKAGE) == []


def test_the_eager_import_check_finds_one(tmp_path: Path) -> None:
    """Fed a module importing the fast store at its top, the check reports it; the same
    import in a function or under ``TYPE_CHECKING`` it leaves alone."""
    for name in ("__init__.py", "_checkpoint/__init__.py", "_checkpoint/store/__init__.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    (tmp_path / "_checkpoint/store/fast").mkdir()
    (tmp_path / "_checkpoint/store/fast/__init__.py").write_text("")
    (tmp_path / "_checkpoint/store/fast/_bundle.py").write_text("")
    (tmp_path / "_checkpoint/_lazy.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .store.fast import _bundle\n"
        "def f():\n    from .store.fast import _bundle\n"
    )
    (tmp_path / "_checkpoint/_eager.py").write_text("from .store.fast import _bundle\n")
    assert eager_optional_imports(tmp_path) == [
        "_checkpoint._eager:1 imports _checkpoint.store.fast._bundle when it is imported"
    ]


def store_door_violations(root: Path) -> list[str]:
    """Imports of a module of ``_checkpoint/store/`` by a module outside it (any import:
    module level, in a function, type-only): the package's ``__init__`` is its only door."""
    store = "_checkpoint.store"
    return sorted(
        f"{imp.module}:{imp.line} imports {imp.target}"
        for imp in imports_of(root)
        if not (imp.module == store or imp.module.startswith(store + "."))
        and imp.target.startswith(store + ".")
        and imp.target != store + ".__init__"
    )


def test_the_store_has_one_door() -> None:
    """Outside ``_checkpoint/store/`` nothing imports its modules, only ``store/__init__``
    (its names: the stores, the shared modules it re-exports, the lazy doors to the
    optional fast and remote stores)."""
    assert store_door_violations(PACKAGE) == []


def test_the_door_check_finds_a_module_reached_past_it(tmp_path: Path) -> None:
    """Fed a feature module importing ``store/_names.py`` past the door, the check reports
    it; the same names through ``store/__init__`` it leaves alone."""
    for name in (
        "__init__.py",
        "_checkpoint/__init__.py",
        "_checkpoint/store/__init__.py",
        "_checkpoint/store/_names.py",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    (tmp_path / "_checkpoint/_door.py").write_text("from .store import names\n")
    (tmp_path / "_checkpoint/_past.py").write_text("def f():\n    from .store._names import step_of\n")
    assert store_door_violations(tmp_path) == ["_checkpoint._past:2 imports _checkpoint.store._names"]


#: the store implementations, each opened by the chooser alone
IMPLEMENTATIONS = ("plain", "fast", "memory", "remote")


def _type_only_lines(tree: ast.Module) -> set[int]:
    """The lines of the imports under a top-level ``if TYPE_CHECKING:``."""
    lines: set[int] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            lines.update(n.lineno for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom)))
    return lines


def chooser_violations(root: Path) -> list[str]:
    """Imports of a store implementation (``store/plain/``, ``fast/``, ``memory/``,
    ``remote/``) by a module other than the chooser (``store/_choose.py``) and the
    implementation itself. The fast store may build on the plain one; type-only imports
    inside ``store/`` are free, except in ``plain/``, which imports no other at all."""
    store = "_checkpoint.store"
    type_only: dict[str, set[int]] = {}
    for path in sorted(root.rglob("*.py")):
        type_only[module_name(root, path)] = _type_only_lines(ast.parse(path.read_text(), str(path)))
    found = []
    for imp in imports_of(root):
        target = next((f"{store}.{i}" for i in IMPLEMENTATIONS if imp.target.startswith(f"{store}.{i}.")), None)
        if target is None or imp.module.startswith(target + ".") or imp.module == f"{store}._choose":
            continue
        if imp.module.startswith(f"{store}.fast.") and target == f"{store}.plain":
            continue
        in_plain = imp.module.startswith(f"{store}.plain.")
        if imp.module.startswith(store + ".") and not in_plain and imp.line in type_only.get(imp.module, set()):
            continue
        found.append(f"{imp.module}:{imp.line} imports {imp.target}")
    return sorted(found)


def test_only_the_chooser_opens_a_store() -> None:
    """``store/_choose.py`` alone imports the implementations (inside functions, once
    chosen); ``plain/`` imports none of the others; the fast store builds on the plain one."""
    assert chooser_violations(PACKAGE) == []


def test_the_chooser_check_finds_a_store_opened_past_it(tmp_path: Path) -> None:
    """Fed the door importing the fast store, and the plain store importing the remote one
    type-only, the check reports both; the chooser's and the fast store's imports it
    leaves alone."""
    for name in (
        "__init__.py",
        "_checkpoint/__init__.py",
        "_checkpoint/store/__init__.py",
        "_checkpoint/store/plain/__init__.py",
        "_checkpoint/store/plain/_store.py",
        "_checkpoint/store/fast/__init__.py",
        "_checkpoint/store/remote/__init__.py",
        "_checkpoint/store/remote/_tier.py",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    (tmp_path / "_checkpoint/store/fast/_store.py").write_text("from ..plain._store import x\n")
    (tmp_path / "_checkpoint/store/_choose.py").write_text("def f():\n    from .fast._store import F\n")
    (tmp_path / "_checkpoint/store/_past.py").write_text("def f():\n    from .fast._store import F\n")
    (tmp_path / "_checkpoint/store/plain/_restore.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..remote._tier import T\n"
    )
    assert chooser_violations(tmp_path) == [
        "_checkpoint.store._past:2 imports _checkpoint.store.fast._store",
        "_checkpoint.store.plain._restore:3 imports _checkpoint.store.remote._tier",
    ]


def below_violations(root: Path) -> list[str]:
    """Imports by ``_checkpoint/policy/`` and ``_checkpoint/snapshot/`` of anything of
    ``_checkpoint`` above them: ``policy/`` may import ``snapshot/`` (its types), neither
    imports ``store/``, ``saving/`` or the modules at ``_checkpoint/``'s top."""
    found = []
    for imp in imports_of(root):
        for low, allowed in (("policy", ("policy", "snapshot")), ("snapshot", ("snapshot",))):
            if not imp.module.startswith(f"_checkpoint.{low}."):
                continue
            if imp.target.startswith("_checkpoint.") and not any(
                imp.target.startswith(f"_checkpoint.{a}.") for a in allowed
            ):
                found.append(f"{imp.module}:{imp.line} imports {imp.target}")
    return sorted(found)


def test_policy_and_snapshot_import_nothing_above_them() -> None:
    """``policy/`` (when to save, what to keep) and ``snapshot/`` (the consistent copy) are
    plain layers: the saver, the store and the parts build on them, not the reverse."""
    assert below_violations(PACKAGE) == []


def test_the_below_check_finds_a_policy_reaching_up(tmp_path: Path) -> None:
    """Fed a policy module importing the checkpointer, the check reports it; its import
    of a snapshot type it leaves alone."""
    for name in (
        "__init__.py",
        "_checkpoint/__init__.py",
        "_checkpoint/_manager.py",
        "_checkpoint/policy/__init__.py",
        "_checkpoint/snapshot/__init__.py",
        "_checkpoint/snapshot/_snapshot.py",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    (tmp_path / "_checkpoint/policy/_up.py").write_text(
        "from ..snapshot._snapshot import Snapshot\nfrom .._manager import Checkpointer\n"
    )
    assert below_violations(tmp_path) == ["_checkpoint.policy._up:2 imports _checkpoint._manager"]
