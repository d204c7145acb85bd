"""Real object-storage servers on 127.0.0.1 for the remote-tier tests, started by the
tests themselves: ``moto``'s S3 server, ``gcp-storage-emulator`` and Azurite (Azure
Blob), each in a child process; :class:`FaultProxy`, a TCP proxy in front of one
that can be cut (every connection refused and dropped), blackholed (every packet
dropped: connections hang) or throttled (a slow network), then healed; and
:class:`Child`, ``scripts/remote_train.py`` in a child process.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _timing import scaled, slowness

#: a test of the remote tier that runs on both anyio backends (the others: asyncio)
both_backends = pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])

#: credentials the S3 server accepts (moto takes any)
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_SESSION_TOKEN": "testing",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_http(url: str, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + scaled(60)
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before serving")
        try:
            urllib.request.urlopen(url, timeout=2).close()
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not answer at {url} within 60 s") from None
            time.sleep(0.05)  # polled until it serves, with a deadline
        else:
            return


class Server:
    """A storage server in a child process on 127.0.0.1 (``endpoint`` is its URL)."""

    def __init__(self, argv: list[str], port: int, what: str, env: dict[str, str] | None = None) -> None:
        self.port = port
        self.endpoint = f"http://127.0.0.1:{port}"
        self.what = what
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})}
        )
        try:
            _wait_http(self.endpoint + "/", self.proc, what)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=scaled(20))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def moto_server(*, check_credentials: bool = False) -> Server:
    """``moto``'s S3 API server (``python -m moto.server``); ``check_credentials``: it
    refuses keys its IAM does not know, as S3 does (it accepts any by default)."""
    port = free_port()
    env = {"INITIAL_NO_AUTH_ACTION_COUNT": "0"} if check_credentials else {}
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    return Server(argv, port, "the moto S3 server", env)


def gcs_emulator() -> Server:
    """``gcp-storage-emulator`` (in memory)."""
    port = free_port()
    return Server(
        [
            sys.executable,
            "-m",
            "gcp_storage_emulator",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--in-memory",
        ],
        port,
        "the GCS emulator",
    )


#: where ``make venv`` installs Azurite (the Azure Storage emulator, an npm package)
AZURITE_BLOB = Path(__file__).resolve().parents[2] / ".venv" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
#: Azurite's well-known development account (the emulator's documented key, not a secret)
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def azurite_missing() -> str | None:
    """Why Azurite cannot run on this machine (``None``: it can)."""
    if shutil.which("node") is None:
        return "needs Node.js for Azurite, the Azure Blob emulator (no node on this machine's PATH)"
    if not AZURITE_BLOB.exists():
        return f"needs Azurite, which make venv installs with npm when the machine has it ({AZURITE_BLOB} missing)"
    return None


def azurite() -> Server:
    """Azurite's Blob service (in memory), the Azure Storage emulator."""
    port = free_port()
    argv = [str(AZURITE_BLOB), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence"]
    return Server([*argv, "--silent", "--skipApiVersionCheck", "--loose"], port, "Azurite")


def azurite_connection_string(server: Server) -> str:
    """The connection string of Azurite's development account on ``server``."""
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint={server.endpoint}/{AZURITE_ACCOUNT};"
    )


def _boto_credentials() -> dict[str, str]:
    return {
        "aws_access_key_id": S3_ENV["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": S3_ENV["AWS_SECRET_ACCESS_KEY"],
        "region_name": S3_ENV["AWS_DEFAULT_REGION"],
    }


def s3_call(endpoint: str, method: str, **kwargs: Any) -> Any:
    """One call of a boto3 S3 client of ``endpoint`` (looking behind the product's back);
    a ``Body`` comes back read. The client is closed after it: an unclosed one's sockets
    surface as ResourceWarnings in whatever test runs when they are collected."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, **_boto_credentials())
    try:
        out = getattr(client, method)(**kwargs)
        body = out.get("Body") if isinstance(out, dict) else None
        if body is not None:
            with contextlib.closing(body):
                out = {**out, "Body": body.read()}
        return out
    finally:
        client.close()


def make_bucket(endpoint: str, bucket: str) -> None:
    """Create an S3 bucket on ``endpoint``."""
    s3_call(endpoint, "create_bucket", Bucket=bucket)


def _split(url: str) -> tuple[str, str]:
    bucket, _, prefix = url[len("s3://") :].partition("/")
    return bucket, prefix


def s3_keys(endpoint: str, url: str) -> list[str]:
    """The object names under the logdir ``url``, relative to it, sorted."""
    bucket, prefix = _split(url)
    listing = s3_call(endpoint, "list_objects_v2", Bucket=bucket, Prefix=prefix + "/")
    return sorted(o["Key"][len(prefix) + 1 :] for o in listing.get("Contents", []))


def s3_read(endpoint: str, url: str, name: str) -> bytes:
    """The object ``name`` of the logdir ``url``."""
    bucket, prefix = _split(url)
    return bytes(s3_call(endpoint, "get_object", Bucket=bucket, Key=f"{prefix}/{name}")["Body"])


def s3_write(endpoint: str, url: str, name: str, body: bytes) -> None:
    """Put the object ``name`` into the logdir ``url``."""
    bucket, prefix = _split(url)
    s3_call(endpoint, "put_object", Bucket=bucket, Key=f"{prefix}/{name}", Body=body)


def s3_objects(endpoint: str, url: str) -> dict[str, tuple[str, int, str]]:
    """Each object under the logdir ``url`` (relative name): its ETag, size and time of
    last modification, so that a rewrite of the same bytes shows too."""
    bucket, prefix = _split(url)
    listing = s3_call(endpoint, "list_objects_v2", Bucket=bucket, Prefix=prefix + "/")
    return {
        o["Key"][len(prefix) + 1 :]: (str(o["ETag"]), int(o["Size"]), o["LastModified"].isoformat())
        for o in listing.get("Contents", [])
    }


def s3_multipart_uploads(endpoint: str, url: str) -> list[str]:
    """The objects (relative names) under the logdir ``url`` with a multipart upload in
    progress: started, neither completed nor aborted."""
    bucket, prefix = _split(url)
    listing = s3_call(endpoint, "list_multipart_uploads", Bucket=bucket, Prefix=prefix + "/")
    return sorted(u["Key"][len(prefix) + 1 :] for u in listing.get("Uploads", []))


def step_of(name: str) -> int:
    """The step of a checkpoint object's name: ``model.ckpt-12.index`` -> 12."""
    return int(name.split("-")[1].split(".")[0])


def markers(endpoint: str, url: str) -> list[int]:
    """The steps of the committed checkpoints (their markers) under ``url``, ascending."""
    return sorted(step_of(k) for k in s3_keys(endpoint, url) if k.endswith(".asv-commit"))


def orphans(endpoint: str, url: str) -> list[str]:
    """The checkpoint objects under ``url`` whose checkpoint has no commit marker."""
    keys = s3_keys(endpoint, url)
    committed = {step_of(k) for k in keys if k.endswith(".asv-commit")}
    return [k for k in keys if k.startswith("model.ckpt-") and step_of(k) not in committed]


class FaultProxy:
    """A TCP proxy on 127.0.0.1 in front of ``upstream_port``.

    ``cut()``: connections in flight are dropped and new ones closed at once (a network
    outage); ``blackhole()``: nothing passes either way, and nothing is answered, but no
    connection is closed: new ones are accepted and hang like those in flight (a firewall
    dropping every packet); ``heal()`` ends either (what a blackhole held then flows on).
    ``throttle(bytes_per_sec)``: what clients send goes no faster (a slow uplink);
    ``None`` lifts it.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = int(self._sock.getsockname()[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._down = False
        self._black = False
        self._rate: float | None = None
        self._conns: set[socket.socket] = set()
        self._pumps: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._flow = threading.Condition(self._lock)  # notified when a blackhole ends or connections drop
        self._closed = False
        self.sent = 0  # bytes passed from clients upstream
        self._thread = threading.Thread(target=self._accept, name="test-proxy", daemon=True)
        self._thread.start()

    def cut(self) -> None:
        with self._lock:
            self._down = True
            conns, self._conns = self._conns, set()
            self._flow.notify_all()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def blackhole(self) -> None:
        with self._lock:
            self._black = True

    def heal(self) -> None:
        with self._lock:
            self._down = False
            self._black = False
            self._flow.notify_all()

    def throttle(self, bytes_per_sec: float | None) -> None:
        self._rate = bytes_per_sec

    def close(self) -> None:
        self._closed = True
        self.cut()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone does not)
        self._sock.close()
        self._thread.join(timeout=scaled(5))
        for pump in self._pumps:  # each ends at its next read or write of a cut connection
            pump.join(timeout=scaled(5))

    def _held(self, src: socket.socket) -> bool:
        """In a blackhole: hold what ``src`` sent until it ends; whether the connection was
        dropped meanwhile (a cut, the proxy closed)."""
        with self._lock:
            while self._black and src in self._conns:
                self._flow.wait()
            return src not in self._conns

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            if self._down:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns.update((client, upstream))
            for args in ((client, upstream, True), (upstream, client, False)):
                pump = threading.Thread(target=self._pump, args=args, daemon=True)
                pump.start()
                self._pumps.append(pump)

    def _pump(self, src: socket.socket, dst: socket.socket, up: bool) -> None:
        try:
            while True:
                rate = self._rate if up else None
                data = src.recv(16384 if rate is None else max(1024, int(rate / 20)))
                if not data:
                    break
                if self._black and self._held(src):
                    break
                if rate is not None:
                    time.sleep(len(data) / rate)
                dst.sendall(data)
                if up:
                    self.sent += len(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            with self._lock:
                self._conns.discard(src)
                self._conns.discard(dst)
                self._flow.notify_all()  # the other direction, if held, drops too


@contextlib.contextmanager
def running(server: Server) -> Iterator[Server]:
    try:
        yield server
    finally:
        server.stop()


#: the training the field tests run in child processes
TRAIN_SCRIPT = Path(__file__).parent / "scripts" / "remote_train.py"


class Child:
    """``scripts/remote_train.py URL LOCAL MAX_STEPS SAVE_STEPS MB GRACE`` in a child
    process; ``env``: variables over this process's environment; ``wrap``: a command the
    training runs under (``unshare ...``), in a process group of its own that
    :meth:`kill` ends whole. What it prints goes to files (read any time: :meth:`out`,
    :meth:`err`), so that a long run never blocks on a full pipe."""

    def __init__(
        self,
        url: str,
        local: Path,
        max_steps: int,
        save_steps: int,
        mb: float,
        grace: float = 60,
        *,
        env: dict[str, str] | None = None,
        wrap: list[str] | None = None,
    ) -> None:
        full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
        argv = [str(a) for a in (url, local, max_steps, save_steps, mb, grace)]
        self._out = tempfile.TemporaryFile()
        self._err = tempfile.TemporaryFile()
        self.group = wrap is not None
        self.proc = subprocess.Popen(
            [*(wrap or []), sys.executable, str(TRAIN_SCRIPT), *argv],
            stdout=self._out,
            stderr=self._err,
            env=full_env,
            start_new_session=self.group,
        )

    @staticmethod
    def _read(f: Any) -> str:
        if f.closed:
            return ""
        return os.pread(f.fileno(), os.fstat(f.fileno()).st_size, 0).decode(errors="replace")

    def out(self) -> str:
        """What it printed on stdout so far."""
        return self._read(self._out)

    def err(self) -> str:
        """What it printed on stderr so far (its log)."""
        return self._read(self._err)

    def started(self) -> int | None:
        """The step of its ``started <step>`` line (``None``: not started yet)."""
        found = re.search(r"^started (\d+)$", self.out(), re.MULTILINE)
        return None if found is None else int(found.group(1))

    def finish(self, timeout: float = 120) -> tuple[int, str, str]:
        """Wait for its exit: its status, stdout and stderr."""
        self.proc.wait(timeout=scaled(timeout))
        return self.proc.returncode, self.out(), self.err()

    def _descendants(self) -> list[int]:
        found: list[int] = []
        todo = [self.proc.pid]
        while todo:
            pid = todo.pop()
            with contextlib.suppress(OSError):
                kids = [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
                found += kids
                todo += kids
        return found

    def kill(self) -> None:
        """SIGKILL it (its whole process group if wrapped) and wait until every process of
        it is gone (a zombie holds no lock any more)."""
        if self.proc.poll() is None:
            if self.group:
                inner = self._descendants()
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                for pid in inner:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                until("the killed training's processes to be gone", lambda: not any(map(_running, inner)), secs=30)
            else:
                self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        """Kill it if it runs, and close its output files."""
        self.kill()
        self._out.close()
        self._err.close()


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (not a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def until(what: str, cond: Callable[[], bool], child: Child | None = None, secs: float = 60) -> None:
    """Poll ``cond`` until it holds, failing after ``secs`` or when ``child`` exits first.
    ``secs`` stretches by the slowest the machine was during the wait (a second suite
    that starts loading it midway), not only by how slow it was as the wait began."""
    began = time.monotonic()
    worst = slowness()
    while not cond():
        if child is not None and child.proc.poll() is not None:
            raise AssertionError(f"the training exited ({child.proc.returncode}) before {what}: {child.err()[-3000:]}")
        worst = max(worst, slowness())
        assert time.monotonic() < began + secs * worst, f"no {what} within {secs} s (x{worst:.2f})"
        time.sleep(0.02)  # polling a condition, with a deadline
