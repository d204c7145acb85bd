"""URL logdirs: what counts as one, which fsspec implementation serves it, where its
local working directory is. Pure decisions at construction: no network, no TensorFlow.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

__all__ = ["EXTRAS", "check_not_mistyped", "check_url", "default_local_dir", "is_url"]

#: the extra that installs each protocol's implementation
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure"}

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def is_url(logdir: object) -> bool:
    """Whether ``logdir`` is a URL (``scheme://...``) other than ``file://``."""
    if not isinstance(logdir, str):
        return False
    m = _SCHEME.match(logdir)
    return m is not None and m.group(1).lower() != "file"


def _install_hint(scheme: str) -> str:
    extra = EXTRAS.get(scheme)
    return f"pip install 'asupervisor[{extra}]'" if extra else "install the fsspec implementation for it"


_ONE_SLASH = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):/(?!/)")


def check_not_mistyped(logdir: object) -> None:
    """Refuse a local path that is a storage URL with one slash (``s3:/bucket/run``):
    it would train into a local directory named ``s3:``.

    Raises:
        ValueError: naming the logdir and the URL it was probably meant to be.
    """
    if not isinstance(logdir, str):
        return
    m = _ONE_SLASH.match(logdir)
    if m is None or (m.group(1).lower() not in EXTRAS and m.group(1).lower() not in ("memory", "file")):
        return
    scheme = m.group(1)
    meant = f"{scheme}://{logdir[m.end() :]}"
    raise ValueError(
        f"logdir {logdir!r} looks like a URL with one slash after {scheme + ':'!r}: write {meant!r} "
        f"(or './{logdir}' for a local directory of that name)"
    )


def check_url(url: str) -> str:
    """``url`` normalised (no trailing ``/``), once its scheme is known to be served.

    Raises:
        ValueError: naming the URL: no bucket or path, a scheme fsspec does not know, or
            its implementation (``s3fs``, ``gcsfs``, ``adlfs``) is not installed.
    """
    m = _SCHEME.match(url)
    assert m is not None, url
    scheme = m.group(1).lower()
    rest = url[m.end() :].strip("/")
    if not rest:
        raise ValueError(f"logdir {url!r} names no bucket or path after {scheme}://")
    try:
        import fsspec
    except ImportError:
        raise ValueError(
            f"logdir {url!r} is a URL; object storage needs fsspec and the {scheme}:// implementation: "
            f"{_install_hint(scheme)}"
        ) from None
    from fsspec.registry import known_implementations, registry

    if scheme not in registry and scheme not in known_implementations:
        raise ValueError(
            f"logdir {url!r}: no storage implementation handles {scheme}:// (fsspec knows "
            "s3://, gs://, az://, memory:// and others); use a local path or a supported URL"
        )
    try:
        fsspec.get_filesystem_class(scheme)
    except ImportError as exc:
        raise ValueError(
            f"logdir {url!r} needs the {scheme}:// implementation ({exc}): {_install_hint(scheme)}"
        ) from None
    return f"{scheme}://{rest}"


def default_local_dir(url: str, task: str | None = None) -> Path:
    """The local working directory of ``url`` (and of a non-chief ``task``, which must not
    share the chief's): ``$XDG_CACHE_HOME/asupervisor/<name>-<hash>``, ``~/.cache`` when
    the variable is unset."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    key = url if task is None else f"{url}#{task}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    tail = re.sub(r"[^A-Za-z0-9._-]+", "_", url.split("://", 1)[1])[-60:].strip("_") or "run"
    return Path(cache) / "asupervisor" / f"{tail}-{digest}{'' if task is None else '-' + task}"
