"""Real object-storage servers on 127.0.0.1 for the remote-tier tests, started by the
tests themselves: ``moto``'s S3 server, ``gcp-storage-emulator`` and Azurite (Azure
Blob), each in a child process; and :class:`FaultProxy`, a TCP proxy in front of one
that can be cut (every connection refused and dropped) or throttled (a slow network),
then healed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

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
    deadline = time.monotonic() + 60
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
                self.proc.wait(timeout=20)
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


class FaultProxy:
    """A TCP proxy on 127.0.0.1 in front of ``upstream_port``.

    ``cut()``: connections in flight are dropped and new ones closed at once (a network
    outage); ``heal()`` ends it. ``throttle(bytes_per_sec)``: what clients send goes no
    faster (a slow uplink); ``None`` lifts it.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = int(self._sock.getsockname()[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._down = False
        self._rate: float | None = None
        self._conns: set[socket.socket] = set()
        self._pumps: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False
        self.sent = 0  # bytes passed from clients upstream
        self._thread = threading.Thread(target=self._accept, name="test-proxy", daemon=True)
        self._thread.start()

    def cut(self) -> None:
        with self._lock:
            self._down = True
            conns, self._conns = self._conns, set()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def heal(self) -> None:
        self._down = False

    def throttle(self, bytes_per_sec: float | None) -> None:
        self._rate = bytes_per_sec

    def close(self) -> None:
        self._closed = True
        self.cut()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone does not)
        self._sock.close()
        self._thread.join(timeout=5)
        for pump in self._pumps:  # each ends at its next read or write of a cut connection
            pump.join(timeout=5)

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


@contextlib.contextmanager
def running(server: Server) -> Iterator[Server]:
    try:
        yield server
    finally:
        server.stop()
