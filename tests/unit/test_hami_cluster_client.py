"""KubeCluster over the official client: every call gives its connection back to the pool,
so a component's calls share kept-alive connections instead of opening one each (a TLS
handshake per call against a real API server)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes import client

from gpulab.hami.cluster import ClusterError, KubeCluster
from gpulab.kube import CONNECTIONS
from harness.ports import free_port


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the API server

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.server.requests.append((self.command, self.path))  # type: ignore[attr-defined]
        body = json.dumps({"kind": "Status", "metadata": {"name": "n"}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PATCH = do_POST = _answer

    def log_message(self, *_args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.connections = 0
        self.requests: list[tuple[str, str]] = []

    def get_request(self):  # type: ignore[no-untyped-def]
        self.connections += 1
        return super().get_request()


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_calls_reuse_one_kept_alive_connection(server: _Server) -> None:
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{server.server_address[1]}"
    cluster = KubeCluster(client.ApiClient(cfg))
    for i in range(5):
        cluster.patch_pod_annotations("ns", f"p{i}", {"a": "b"})
        cluster.patch_node_annotations("n", {"a": None}, resource_version="7")
        cluster.create_binding("ns", f"p{i}", "uid", "n")
        cluster.get_node("n")
    assert len(server.requests) == 20
    assert server.connections == 1  # an unread response would hold its connection


def test_the_lab_client_keeps_many_connections() -> None:
    # urllib3 opens (and drops) a new connection for each request past its pool size
    assert CONNECTIONS >= 32


class _CutShort(_Handler):
    """Answers with half a body and hangs up: an API server killed mid-answer."""

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "100")
        self.end_headers()
        self.wfile.write(b'{"kind": ')
        self.wfile.flush()
        self.close_connection = True

    do_GET = do_PATCH = do_POST = _answer


def test_an_answer_cut_short_or_no_answer_is_a_cluster_error() -> None:
    """What HAMi handles as an error (a node lock it could not release, a Bind that did
    not land) must not escape as urllib3's: the device plugin once answered Allocate
    with gRPC UNKNOWN when kube-apiserver was killed mid-answer (tests/e2e/
    test_reliability.py), where HAMi logs the lock error and returns the response."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _CutShort)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{srv.server_address[1]}"
    cfg.retries = 0
    cut = KubeCluster(client.ApiClient(cfg))
    try:
        with pytest.raises(ClusterError, match="node n: "):
            cut.get_node("n")
        with pytest.raises(ClusterError, match="node n: "):
            cut.patch_node_annotations("n", {"hami.io/mutex.lock": None})
    finally:
        srv.shutdown()
        srv.server_close()
    down = client.Configuration()
    down.host = f"http://127.0.0.1:{free_port()}"
    down.retries = 0
    with pytest.raises(ClusterError, match="pod ns/p: "):
        KubeCluster(client.ApiClient(down)).get_pod("ns", "p")
