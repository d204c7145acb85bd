"""The public surface: names, docstrings, and a cheap, side-effect-free import."""

from __future__ import annotations

import inspect
import subprocess
import sys

import asupervisor as asv


def test_all_is_sorted_and_complete() -> None:
    """__all__ is sorted and every name in it exists."""
    assert list(asv.__all__) == sorted(asv.__all__)
    for name in asv.__all__:
        assert hasattr(asv, name), name


def test_every_public_name_has_a_docstring() -> None:
    """Every public class and function, and their public methods, are documented."""
    missing = []
    for name in asv.__all__:
        obj = getattr(asv, name)
        if not inspect.getdoc(obj):
            missing.append(name)
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_") or not (inspect.isfunction(member) or isinstance(member, property)):
                    continue
                if not inspect.getdoc(member):
                    missing.append(f"{name}.{attr}")
    assert not missing, f"undocumented: {missing}"


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
    for path in package.glob("*.py"):
        text = path.read_text()
        for needle in ("to_thread", "run_in_executor"):
            if needle in text:
                offenders.append(f"{path.name}: {needle}")
        for line in text.splitlines():
            if re.search(r"ThreadPoolExecutor\(", line) and not line.strip().startswith("with "):
                offenders.append(f"{path.name}: {line.strip()}")
    assert not offenders
