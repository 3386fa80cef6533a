"""gpulab.informer's HTTP side against a real HTTP server speaking the API server's list
and watch wire format (JSON list, then a chunked stream of watch events that the server
ends at its timeoutSeconds), through the official client's ApiClient and urllib3."""

from __future__ import annotations

import errno
import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar
from urllib.parse import parse_qs, urlparse

import pytest
from kubernetes import client

from gpulab.informer import PODS, SYNCED, ListWatch, Store, reflect

HELD = 100  # the resourceVersion whose watch the server keeps open
RELEASE = threading.Event()


class FakeApiServer(BaseHTTPRequestHandler):
    """GET /api/v1/pods: a list at resourceVersion 1, or a watch that sends one ADDED
    event after the requested resourceVersion and ends, as a watch whose timeoutSeconds
    ran out does."""

    protocol_version = "HTTP/1.1"
    lists: ClassVar[list[str]] = []
    watches: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        query = parse_qs(urlparse(self.path).query)
        if query.get("watch") != ["true"]:
            type(self).lists.append(self.path)
            self._send(json.dumps({"metadata": {"resourceVersion": "1"}, "items": []}).encode())
            return
        rv = int(query["resourceVersion"][0])
        type(self).watches.append(str(rv))
        pod = {"metadata": {"name": f"p{rv}", "namespace": "ns", "resourceVersion": str(rv + 1)}}
        event = json.dumps({"type": "ADDED", "object": pod}).encode() + b"\n"
        if rv == HELD:  # a watch that stays open: the client's read blocks
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
            RELEASE.wait(10)
            return
        self._send(event)

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    FakeApiServer.lists, FakeApiServer.watches = [], []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeApiServer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    RELEASE.clear()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    RELEASE.set()
    httpd.shutdown()


def test_a_watch_the_server_ended_is_resumed_without_a_relist(
    server: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The server ends each watch (timeoutSeconds): the reflector watches again from the
    last resourceVersion it saw. One list, no warning: a connection urllib3 already put
    back in the pool is not an error (it once was, and every watch timeout relisted)."""
    config = client.Configuration(host=server)
    lw = ListWatch(client.ApiClient(config), PODS)
    stop = threading.Event()
    seen = []
    with caplog.at_level(logging.WARNING, logger="gpulab.informer"):
        for delta in reflect(lw, Store(), stop):
            if delta.type != SYNCED:
                seen.append(delta.obj["metadata"]["name"])
            if len(seen) == 3:
                stop.set()
    assert seen == ["p1", "p2", "p3"]
    assert FakeApiServer.watches[:3] == ["1", "2", "3"]  # each from the last event's rv
    assert len(FakeApiServer.lists) == 1
    assert not caplog.records, [r.getMessage() for r in caplog.records]


def test_closing_a_watch_whose_socket_is_already_closed_does_not_raise(server: str) -> None:
    """Informer.stop closes the open watch from the caller's thread while the watching
    thread, its read interrupted, may have closed the socket already: the shutdown then
    meets EBADF, which once crashed a demo's exit. Closing twice is a no-op too."""
    lw = ListWatch(client.ApiClient(client.Configuration(host=server)), PODS)
    stream = lw.watch(str(HELD))
    events = iter(stream)  # kept: a dropped generator would hand the connection back
    assert next(events)[1]["metadata"]["name"] == f"p{HELD}"

    def closed_meanwhile(_how: int) -> None:  # the other thread's close got there first
        raise OSError(errno.EBADF, "Bad file descriptor")

    stream._response._sock_shutdown = closed_meanwhile
    stream.close()
    assert stream._response.connection is None  # handed back all the same
    stream.close()
