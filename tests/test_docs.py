"""The documentation runs: every ```python block of docs/*.md and README.md is executed.

How a page runs. Its blocks run in document order in one namespace (a later block uses
what an earlier one defined), with the working directory a fresh temporary directory
(so ``runs/...`` paths land there). A block may use top-level ``await``, ``async with``
and ``async for``: it is compiled with ``ast.PyCF_ALLOW_TOP_LEVEL_AWAIT`` and the
resulting coroutine runs under ``anyio.run`` on the page's backend(s) (``BACKENDS``).
Tracebacks name the page and its line numbers.

Markup the test understands:

* ```` ```python ```` — a block that must run; it may not hold ``...`` placeholders.
* ```` ```python tf1 ```` — TF1 code shown for comparison; not run, but it must really be
  TF1 code (``TF1_MARKERS``).
* ``<!-- setup`` ... ``-->`` and ``<!-- check`` ... ``-->`` — hidden Python (invisible on
  GitHub) run in order with the page's blocks: a setup defines what a fragment needs
  (a tiny model, a dataset), a check asserts what the text around a block claims.

To keep the cost to one TensorFlow import, all pages run in ONE subprocess, each page in
its own namespace and its own directory; the results come back as JSON lines, one test
per page reads its own. Run this file as a script to run pages by hand:
``python tests/test_docs.py docs/services.md``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _timing import scaled

ROOT = Path(__file__).resolve().parent.parent
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
PAGE_NAMES = [p.relative_to(ROOT).as_posix() for p in PAGES]

#: anyio backends a page's top-level awaits run on (default: asyncio). A page listed
#: with two backends runs twice, each run in a fresh namespace and directory.
BACKENDS: dict[str, tuple[str, ...]] = {
    "docs/services.md": ("trio",),
    "docs/getting-started.md": ("asyncio", "trio"),
}

#: What makes a ```python tf1 block TF1 code: graph-mode APIs that TF2 has no more, or a
#: ``sess.run(...)`` that is not awaited (a graph session's).
TF1_MARKERS = tuple(
    re.compile(p)
    for p in (
        r"\btf\.train\.Supervisor\b",
        r"\btf\.(compat\.v1\.)?train\.MonitoredTrainingSession\b",
        r"\btf\.compat\.v1\b",
        r"\btf\.Session\(",
        r"\btf\.train\.(Saver|QueueRunner|SessionManager|Coordinator)\b",
        r"\btf\.placeholder\(",
        r"(?<!await )\bsess\.run\(",
    )
)

#: The whole run's bound; a hang is reported with the block that was running.
RUN_TIMEOUT_SECS = scaled(240)

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*?)\s*$")
_HIDDEN_START = re.compile(r"^<!--\s*(?P<kind>setup|check)\s*$")
_HIDDEN_END = re.compile(r"^\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One code block of a page: ``kind`` is run, setup, check or tf1."""

    page: str
    line: int  # 1-based line of the block's first code line in the page
    kind: str
    source: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def parse_blocks(page: str, text: str) -> list[Block]:
    """The Python blocks of a page (fenced and hidden), in order.

    Raises:
        ValueError: a fence or hidden block is not closed, or a Python fence carries an
            unknown marker (``python foo``) or spelling (``py``), which would otherwise
            be silently left unrun.
    """
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        hidden = _HIDDEN_START.match(lines[i])
        fence = _FENCE.match(lines[i])
        if hidden:
            end = next((j for j in range(i + 1, len(lines)) if _HIDDEN_END.match(lines[j])), None)
            if end is None:
                raise ValueError(f"{page}:{i + 1}: <!-- {hidden['kind']} is never closed with -->")
            blocks.append(Block(page, i + 2, hidden["kind"], "\n".join(lines[i + 1 : end]) + "\n"))
            i = end + 1
            continue
        if fence:
            char, length, indent = fence["fence"][0], len(fence["fence"]), len(fence["indent"])
            closing = re.compile(rf"^ {{0,3}}{re.escape(char)}{{{length},}}\s*$")
            end = next((j for j in range(i + 1, len(lines)) if closing.match(lines[j])), None)
            if end is None:
                raise ValueError(f"{page}:{i + 1}: code fence is never closed")
            words = fence["info"].split()
            lang = words[0].lower() if words else ""
            if lang.startswith("py") and lang != "python":
                raise ValueError(f"{page}:{i + 1}: write ```python, not ```{lang} (the docs test runs only ```python)")
            if lang == "python":
                markers = words[1:]
                if markers not in ([], ["tf1"]):
                    raise ValueError(f"{page}:{i + 1}: unknown marker {markers!r} on a python fence (known: tf1)")
                body = [ln[indent:] if ln[:indent].isspace() else ln for ln in lines[i + 1 : end]]
                blocks.append(Block(page, i + 2, "tf1" if markers else "run", "\n".join(body) + "\n"))
            i = end + 1
            continue
        i += 1
    return blocks


def page_blocks(page: str) -> list[Block]:
    """The blocks of ``page`` (a path relative to the repository)."""
    return parse_blocks(page, (ROOT / page).read_text(encoding="utf-8"))


def placeholders(block: Block) -> list[int]:
    """Lines (in the page) where a block uses ``...`` as a value."""
    tree = ast.parse(block.source)
    return sorted(
        block.line + node.lineno - 1
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value is Ellipsis
    )


def is_tf1_code(source: str) -> bool:
    """Whether ``source`` uses an API that only TF1 (graph mode) has."""
    return any(marker.search(source) for marker in TF1_MARKERS)


# ---------------------------------------------------------------------------------------
# The runner (the subprocess side): ``python tests/test_docs.py --spec spec.json out.jsonl``


def _run_spec(spec_path: str, results_path: str) -> int:
    import builtins
    import inspect
    import traceback

    import anyio

    spec = json.loads(Path(spec_path).read_text())
    base = Path.cwd()
    failed = 0

    async def await_coroutine(coro: Any) -> Any:
        return await coro

    with open(results_path, "a", encoding="utf-8") as out:

        def emit(**record: Any) -> None:
            out.write(json.dumps(record) + "\n")
            out.flush()

        for run in spec:
            workdir = base / run["id"].replace("/", "_").replace(":", "_")
            workdir.mkdir()
            os.chdir(workdir)
            namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
            error = None
            for block in run["blocks"]:
                where = f"{run['page']}:{block['line']}"
                emit(id=run["id"], event="start", where=where)
                print(f"--- {run['id']} block at {where}", flush=True)
                try:
                    source = "\n" * (block["line"] - 1) + block["source"]
                    code = compile(
                        source, str(ROOT / run["page"]), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True
                    )
                    result = eval(code, namespace)  # noqa: S307 - running the docs is the point
                    if code.co_flags & inspect.CO_COROUTINE:
                        anyio.run(await_coroutine, result, backend=run["backend"])
                except (Exception, SystemExit) as exc:
                    if isinstance(exc, SystemExit) and exc.code in (0, None):
                        continue  # a script's sys.exit(0): the block ended as it should (checks follow)
                    error = traceback.format_exc()
                    emit(id=run["id"], event="fail", where=where, traceback=error)
                    failed += 1
                    break
            if error is None:
                emit(id=run["id"], event="ok")
            os.chdir(base)
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------
# The tests


def _runs() -> list[dict[str, Any]]:
    runs = []
    for page in PAGE_NAMES:
        blocks = [b for b in page_blocks(page) if b.kind != "tf1"]
        if not blocks:
            continue
        for backend in BACKENDS.get(page, ("asyncio",)):
            runs.append(
                {
                    "id": f"{page}[{backend}]",
                    "page": page,
                    "backend": backend,
                    "blocks": [{"line": b.line, "source": b.source} for b in blocks],
                }
            )
    return runs


@dataclass
class DocsRun:
    """The outcome of running the docs: JSON-line records by run id, and the output."""

    records: dict[str, list[dict[str, Any]]]
    output: str
    ended: str  # how the subprocess ended


def run_docs(runs: list[dict[str, Any]], workdir: Path, timeout: float = RUN_TIMEOUT_SECS) -> DocsRun:
    """Runs ``runs`` (see ``_runs``) in one subprocess in ``workdir``, bounded by ``timeout``."""
    spec = workdir / "spec.json"
    spec.write_text(json.dumps(runs))
    results = workdir / "results.jsonl"
    results.touch()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
    log = workdir / "output.txt"
    with open(log, "w") as out:
        try:
            proc = subprocess.run(
                [sys.executable, __file__, "--spec", str(spec), str(results)],
                cwd=workdir,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
            )
            ended = f"exit status {proc.returncode}"
        except subprocess.TimeoutExpired:
            ended = f"killed after {timeout} s"
    records: dict[str, list[dict[str, Any]]] = {}
    for line in results.read_text().splitlines():
        record = json.loads(line)
        records.setdefault(record["id"], []).append(record)
    return DocsRun(records, log.read_text(errors="replace"), ended)


def page_problems(result: DocsRun, runs: list[dict[str, Any]]) -> list[str]:
    """What went wrong in ``runs``, each naming the page, the block line and the cause."""
    problems = []
    for r in runs:
        records = result.records.get(r["id"], [])
        if any(rec["event"] == "ok" for rec in records):
            continue
        fail = next((rec for rec in records if rec["event"] == "fail"), None)
        if fail is not None:
            problems.append(f"{r['id']}: the block at {fail['where']} failed:\n{fail['traceback']}")
        else:
            started = [rec["where"] for rec in records if rec["event"] == "start"]
            at = f"while the block at {started[-1]} ran" if started else "before the page started"
            problems.append(f"{r['id']}: the docs run ended ({result.ended}) {at}")
        problems.append(f"output of {r['id']}:\n{_output_of(result, r['id'])}")
    return problems


@pytest.fixture(scope="session")
def docs_run(tmp_path_factory: pytest.TempPathFactory) -> DocsRun:
    """Runs every page's blocks in one subprocess (one TensorFlow import)."""
    return run_docs(_runs(), tmp_path_factory.mktemp("docs-run"))


def _output_of(run: DocsRun, run_id: str) -> str:
    """The subprocess output printed while ``run_id`` ran (its last 60 lines)."""
    marker = f"--- {run_id} block at "
    lines = run.output.splitlines()
    mine: list[str] = []
    inside = False
    for line in lines:
        if line.startswith("--- "):
            inside = line.startswith(marker)
        if inside:
            mine.append(line)
    return "\n".join(mine[-60:])


# the first page to ask for the docs run waits for all of it (RUN_TIMEOUT_SECS's 240 s)
@pytest.mark.timeout(270)
@pytest.mark.parametrize("page", PAGE_NAMES)
def test_page_code_blocks_run(page: str, request: pytest.FixtureRequest) -> None:
    """Every ```python block of the page (with its hidden setup/check blocks) runs, in
    order, in one namespace, on the page's backend(s)."""
    runs = [r for r in _runs() if r["page"] == page]
    if not runs:
        return  # no Python on this page
    result: DocsRun = request.getfixturevalue("docs_run")
    problems = page_problems(result, runs)
    assert not problems, "\n\n".join(problems)


@pytest.mark.parametrize("page", PAGE_NAMES)
def test_page_blocks_have_no_placeholders(page: str) -> None:
    """A block that is run is complete: no ``...`` standing for code or values."""
    found = [f"{page}:{line}" for b in page_blocks(page) if b.kind != "tf1" for line in placeholders(b)]
    assert not found, f"placeholders (...) left in blocks that run: {found}"


@pytest.mark.parametrize("page", PAGE_NAMES)
def test_tf1_blocks_are_tf1_code(page: str) -> None:
    """The only blocks not run are ```python tf1 ones, and each really is TF1 code."""
    not_tf1 = [b.where for b in page_blocks(page) if b.kind == "tf1" and not is_tf1_code(b.source)]
    assert not not_tf1, f"```python tf1 blocks without TF1 code (they must run instead): {not_tf1}"


def test_parser_finds_blocks_markers_and_mistakes() -> None:
    """The parser sees fenced and hidden blocks with their page lines, tells tf1 blocks
    apart, and refuses spellings that would silently leave a block unrun."""
    text = (
        "# T\n"
        "<!-- setup\n"
        "x = 1\n"
        "-->\n"
        "```python\n"
        "y = x + 1\n"
        "```\n"
        "```sh\n"
        "ls\n"
        "```\n"
        "```python tf1\n"
        "sess.run(train_op)\n"
        "```\n"
        "<!-- check\n"
        "assert y == 2\n"
        "-->\n"
    )
    blocks = parse_blocks("p.md", text)
    assert [(b.kind, b.line, b.source) for b in blocks] == [
        ("setup", 3, "x = 1\n"),
        ("run", 6, "y = x + 1\n"),
        ("tf1", 12, "sess.run(train_op)\n"),
        ("check", 15, "assert y == 2\n"),
    ]
    for bad in ("```py\nx\n```\n", "```python skip\nx\n```\n", "```python\nx\n", "<!-- setup\nx\n"):
        with pytest.raises(ValueError):
            parse_blocks("p.md", bad)
    assert placeholders(Block("p.md", 10, "run", "a = 1\nmodel = f([...])\n")) == [11]
    assert is_tf1_code("with tf.train.MonitoredTrainingSession() as s:\n    s.run(op)\n")
    assert not is_tf1_code("async with asv.MonitoredTrainingSession('d', state=s) as sess:\n    await sess.run(f)\n")


def test_docs_runner_reports_the_failing_block(tmp_path: Path) -> None:
    """A block that raises is reported with its page line and traceback; later blocks of
    that page do not run; top-level await runs under anyio (trio here). A script's
    ``sys.exit(0)`` ends its block as it should; another status fails it."""
    spec = [
        {
            "id": "bad",
            "page": "docs/x.md",
            "backend": "trio",
            "blocks": [
                {"line": 3, "source": "import anyio.lowlevel\nawait anyio.lowlevel.checkpoint()\nvalue = 41\n"},
                {"line": 9, "source": "value += 1\nassert value == 41, value\n"},
                {"line": 20, "source": "raise SystemExit('never reached')\n"},
            ],
        },
        {
            "id": "good",
            "page": "docs/y.md",
            "backend": "asyncio",
            "blocks": [
                {"line": 1, "source": "import anyio\nasync with anyio.Lock():\n    pass\n"},
                {"line": 5, "source": "import sys\nended = True\nsys.exit(0)\n"},
                {"line": 9, "source": "assert ended\n"},
            ],
        },
        {"id": "exits", "page": "docs/z.md", "backend": "asyncio", "blocks": [{"line": 2, "source": "exit(3)\n"}]},
    ]
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    proc = subprocess.run(
        [sys.executable, __file__, "--spec", "spec.json", "out.jsonl"], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 1, proc.stderr
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    events = [(r["id"], r["event"], r.get("where")) for r in records]
    assert events == [
        ("bad", "start", "docs/x.md:3"),
        ("bad", "start", "docs/x.md:9"),
        ("bad", "fail", "docs/x.md:9"),
        ("good", "start", "docs/y.md:1"),
        ("good", "start", "docs/y.md:5"),
        ("good", "start", "docs/y.md:9"),
        ("good", "ok", None),
        ("exits", "start", "docs/z.md:2"),
        ("exits", "fail", "docs/z.md:2"),
    ]
    assert 'x.md", line 10' in records[2]["traceback"] and "AssertionError: 42" in records[2]["traceback"]


# ---------------------------------------------------------------------------------------
# docs/api.md: the API reference names exactly the public API, with true signatures

API_PAGE = ROOT / "docs" / "api.md"
_ENTRY = re.compile(r"^### `(?P<qual>(?:asupervisor\.testing\.)?\w+)`\s*$")
_DEFINITION = re.compile(r"^`(?P<cls>class )?(?P<mod>asv|asupervisor\.testing)\.(?P<name>\w+)(?P<sig>\(.*?\))?`")
_MEMBER = re.compile(r"^- `(?:await |async with |async for )?(?P<name>\w+)(?P<sig>\(.*?\))?`")


class _Text:
    """A default value shown as given text in a rendered signature."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _default_text(value: Any) -> str:
    import math

    if isinstance(value, float) and math.isinf(value):
        return "math.inf" if value > 0 else "-math.inf"
    if callable(value) and hasattr(value, "__qualname__") and hasattr(value, "__module__"):
        return f"{value.__module__}.{value.__qualname__}"
    return repr(value)


def render_signature(fn: Any, *, drop_first: bool = False) -> str:
    """``fn``'s parameters as the reference shows them: no annotations, ``(a, *, b=1)``."""
    import inspect

    sig = inspect.signature(fn)
    params = list(sig.parameters.values())[1 if drop_first else 0 :]
    shown = [
        p.replace(annotation=p.empty, default=p.default if p.default is p.empty else _Text(_default_text(p.default)))
        for p in params
    ]
    return str(sig.replace(parameters=shown, return_annotation=sig.empty))


@dataclass
class ApiEntry:
    """One ``### `Name``` entry of docs/api.md."""

    qual: str  # "Supervisor" or "asupervisor.testing.ManualClock"
    line: int
    definition: re.Match[str] | None
    members: list[tuple[int, re.Match[str]]]


def api_entries(text: str) -> list[ApiEntry]:
    """The entries of the API page, each with its definition line and member lines."""
    entries: list[ApiEntry] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        entry = _ENTRY.match(line)
        if entry:
            entries.append(ApiEntry(entry["qual"], number, None, []))
        elif line.startswith("#"):
            continue
        elif entries and entries[-1].definition is None and _DEFINITION.match(line):
            entries[-1].definition = _DEFINITION.match(line)
        elif entries and _MEMBER.match(line):
            entries[-1].members.append((number, _MEMBER.match(line)))  # type: ignore[arg-type]
    return entries


def _public_objects() -> dict[str, Any]:
    import asupervisor
    import asupervisor.testing

    objects = {name: getattr(asupervisor, name) for name in asupervisor.__all__}
    objects.update({f"asupervisor.testing.{n}": getattr(asupervisor.testing, n) for n in asupervisor.testing.__all__})
    return objects


def _has_member(cls: type, name: str) -> bool:
    import dataclasses
    import inspect

    if hasattr(cls, name):
        return True
    if dataclasses.is_dataclass(cls) and name in {f.name for f in dataclasses.fields(cls)}:
        return True
    if name in inspect.signature(cls).parameters:
        return True
    # an instance attribute its methods set (``self.service = ...``); read from the source
    # of the class's own functions (the class's ``__module__`` is the package's, so
    # ``inspect.getsource(cls)`` would look in ``__init__.py``)
    pattern = re.compile(rf"\bself\.{name}\s*(:[^=]*)?=[^=]")
    for member in vars(cls).values():
        fn = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
        if inspect.isfunction(fn) and pattern.search(inspect.getsource(fn)):
            return True
    return False


def _required_members(cls: type, public: set[type]) -> set[str]:
    """Public methods and properties a class defines itself, except overrides of a
    public base's member (a stock hook's ``after_run`` is ``SessionRunHook.after_run``)."""
    import inspect

    names = set()
    for attr, member in vars(cls).items():
        if attr.startswith("_"):
            continue
        fn = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
        if not (inspect.isfunction(fn) or isinstance(fn, property)):
            continue
        if any(attr in vars(base) for base in cls.__mro__[1:] if base in public):
            continue
        names.add(attr)
    return names


def _check_api_page(text: str) -> list[str]:
    """Every problem of the API page against the real API (empty: the page is right)."""
    import inspect

    objects = _public_objects()
    public_classes = {o for o in objects.values() if inspect.isclass(o)}
    entries = api_entries(text)
    problems = []
    documented = [e.qual for e in entries]
    for qual in sorted(set(objects) - set(documented)):
        problems.append(f"{qual}: public, but docs/api.md has no `### `{qual}`` entry")
    for qual in sorted({q for q in documented if documented.count(q) > 1}):
        problems.append(f"{qual}: documented more than once")
    for e in entries:
        where = f"docs/api.md:{e.line}"
        if e.qual not in objects:
            problems.append(f"{where}: {e.qual} is not a public name (not in __all__)")
            continue
        obj = objects[e.qual]
        d = e.definition
        if d is None:
            problems.append(f"{where}: {e.qual} has no definition line (`asv.Name(...)` or `class asv.Name`)")
            continue
        expected_mod = "asupervisor.testing" if e.qual.startswith("asupervisor.testing.") else "asv"
        if d["mod"] != expected_mod or d["name"] != e.qual.rsplit(".", 1)[-1]:
            problems.append(f"{where}: the definition line names {d['mod']}.{d['name']}, not {e.qual}")
        if d["sig"] is not None:
            if d["cls"]:
                real = "(" + ", ".join(b.__name__ for b in obj.__bases__) + ")"
            else:
                real = render_signature(obj)
            if d["sig"] != real:
                problems.append(f"{where}: {e.qual} documented as {d['sig']}, but it is {real}")
        if not inspect.isclass(obj):
            continue
        listed = set()
        for number, m in e.members:
            name = m["name"]
            listed.add(name)
            if not _has_member(obj, name):
                problems.append(f"docs/api.md:{number}: {e.qual} has no member {name!r}")
                continue
            member = inspect.getattr_static(obj, name, None)
            if m["sig"] is not None:
                fn = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
                if not callable(fn):
                    problems.append(f"docs/api.md:{number}: {e.qual}.{name} is not a method")
                    continue
                real = render_signature(fn, drop_first=not isinstance(member, staticmethod))
                if m["sig"] != real:
                    problems.append(f"docs/api.md:{number}: {e.qual}.{name} documented as {m['sig']}, but it is {real}")
        for name in sorted(_required_members(obj, public_classes) - listed):
            problems.append(f"{where}: {e.qual}.{name} is public but not listed under {e.qual}")
    return problems


def test_api_reference_matches_the_public_api() -> None:
    """docs/api.md has an entry for every name in ``asupervisor.__all__`` and
    ``asupervisor.testing.__all__`` and for each public method and property; every name it
    documents exists; every signature it shows is the real one."""
    problems = _check_api_page(API_PAGE.read_text(encoding="utf-8"))
    assert not problems, "docs/api.md is out of date:\n" + "\n".join(problems)


def test_api_check_catches_missing_wrong_and_unknown_entries() -> None:
    """The API page check fails on a missing name, a wrong signature, an unknown name and
    an unknown member, so its silence means something."""
    text = API_PAGE.read_text(encoding="utf-8")
    entries = {e.qual: e for e in api_entries(text)}
    lines = text.splitlines()
    # drop the cluster_info entry's heading
    broken = [ln for ln in lines if ln != "### `cluster_info`"]
    assert any("cluster_info: public, but" in p for p in _check_api_page("\n".join(broken)))
    sv_def = entries["Supervisor"].definition
    assert sv_def is not None
    wrong = text.replace(sv_def.group(0), "`asv.Supervisor(logdir)`", 1)
    assert any("Supervisor documented as (logdir)" in p for p in _check_api_page(wrong))
    extra = text + "\n### `Nonexistent`\n\n`asv.Nonexistent()`\n\n- `frobnicate()` — no.\n"
    assert any("Nonexistent is not a public name" in p for p in _check_api_page(extra))
    member = text.replace("- `await save_now()`", "- `await save_later()`", 1)
    found = _check_api_page(member)
    assert any("no member 'save_later'" in p for p in found)
    assert any("Supervisor.save_now is public but not listed" in p for p in found)


def test_docs_run_names_the_block_that_hangs(tmp_path: Path) -> None:
    """A block that never returns is reported, once the run's time is up, with the line
    of the block that was running (and pages after it as not run)."""
    runs = [
        {"id": "a", "page": "docs/a.md", "backend": "asyncio", "blocks": [{"line": 1, "source": "x = 1\n"}]},
        {
            "id": "b",
            "page": "docs/b.md",
            "backend": "asyncio",
            "blocks": [
                {"line": 4, "source": "import threading\n"},
                {"line": 8, "source": "threading.Event().wait()\n"},
            ],
        },
        {"id": "c", "page": "docs/c.md", "backend": "asyncio", "blocks": [{"line": 1, "source": "y = 2\n"}]},
    ]
    problems = page_problems(run_docs(runs, tmp_path, timeout=5), runs)
    assert problems[0] == "b: the docs run ended (killed after 5 s) while the block at docs/b.md:8 ran", problems
    assert problems[2] == "c: the docs run ended (killed after 5 s) before the page started", problems


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_relative_links_resolve() -> None:
    """Every relative link of the docs and README points to a file that exists and, with a
    ``#fragment``, to a heading of that page."""
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue  # http(s):, mailto:
            path, _, fragment = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
                continue
            if fragment and dest.suffix == ".md":
                slugs = {_slug(h) for h in re.findall(r"^#+\s+(.*)$", dest.read_text(encoding="utf-8"), flags=re.M)}
                if fragment not in slugs:
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def _main(argv: list[str]) -> int:
    if argv[:1] == ["--spec"]:
        return _run_spec(argv[1], argv[2])
    # By hand: python tests/test_docs.py [PAGE ...] runs those pages here, in a temp dir.
    import tempfile

    wanted = {Path(p).resolve().relative_to(ROOT).as_posix() for p in argv} or set(PAGE_NAMES)
    runs = [r for r in _runs() if r["page"] in wanted]
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.json"
        spec.write_text(json.dumps(runs))
        os.chdir(tmp)
        status = _run_spec(str(spec), str(Path(tmp) / "results.jsonl"))
        print((Path(tmp) / "results.jsonl").read_text())
    return status


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
