"""A fake GCE metadata server on 127.0.0.1, for the two keys ``GcePreemptionNotice`` watches.

It holds each ``wait_for_change=true`` GET until the test changes the key's value (or the
GET's ``timeout_sec`` passes), answers ``Metadata-Flavor: Google`` with an ``ETag``, and
refuses a request without the ``Metadata-Flavor: Google`` header, as the real server does.
Used by tests/test_gce_preemption.py and the multi-worker test of an agreed notice.
"""

from __future__ import annotations

import http.server
import threading
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

PREEMPTED = "instance/preempted"
MAINTENANCE = "instance/maintenance-event"


class FakeMetadata(http.server.ThreadingHTTPServer):
    """GCE's metadata server, for the two keys the service watches."""

    daemon_threads = False
    block_on_close = True  # server_close() joins the handler threads

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.cond = threading.Condition()
        self.values = {PREEMPTED: "FALSE", MAINTENANCE: "NONE"}
        self.versions = {PREEMPTED: 1, MAINTENANCE: 1}
        self.closing = False
        self.hanging = {PREEMPTED: threading.Event(), MAINTENANCE: threading.Event()}
        self.fail_waits = 0  # answer this many hanging GETs with a 503
        self.refused = 0
        self.thread = threading.Thread(target=self.serve_forever, args=(0.05,), name="fake-metadata", daemon=True)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def set(self, key: str, value: str) -> None:
        with self.cond:
            self.values[key] = value
            self.versions[key] += 1
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        self.shutdown()
        self.server_close()
        self.thread.join()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: FakeMetadata

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, code: int, body: str, etag: str | None = None) -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", "application/text")
        self.send_header("Content-Length", str(len(data)))
        if etag is not None:
            self.send_header("ETag", etag)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        fake = self.server
        if self.headers.get("Metadata-Flavor") != "Google":
            fake.refused += 1
            self._answer(403, "Missing required header: Metadata-Flavor")
            return
        url = urlsplit(self.path)
        key = url.path.removeprefix("/computeMetadata/v1/")
        if key not in fake.values:
            self._answer(404, "not found")
            return
        query = parse_qs(url.query)
        with fake.cond:
            if query.get("wait_for_change") == ["true"]:
                if fake.fail_waits > 0:
                    fake.fail_waits -= 1
                    self._answer(503, "try again")
                    return
                last = query.get("last_etag", [None])[0]
                deadline = time.monotonic() + float(query.get("timeout_sec", ["3600"])[0])
                fake.hanging[key].set()
                while str(fake.versions[key]) == last and not fake.closing:
                    if not fake.cond.wait(timeout=max(0.0, deadline - time.monotonic())):
                        break
            value, etag = fake.values[key], str(fake.versions[key])
        try:
            self._answer(200, value, etag)
        except OSError:
            pass  # the client went away (a stop interrupted its GET)
