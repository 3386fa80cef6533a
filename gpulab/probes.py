"""A GET-only ``http.server`` handler for the lab's plain-HTTP probe and metrics servers
(gpulab-scheduler's /healthz and /readyz, the GPU Operator's probes, dcgm-exporter).

``BaseHTTPRequestHandler`` answers a method it has no ``do_*`` for with 501 Not
Implemented, a 5xx for a client's mistake. Go's ``http.ServeMux`` with a ``GET`` pattern
answers 405 Method Not Allowed with an ``Allow`` header; so do these.
"""

from __future__ import annotations

import http.server


class GetOnly(http.server.BaseHTTPRequestHandler):
    def _not_allowed(self) -> None:
        body = f"method {self.command} not allowed: use GET\n".encode()
        self.send_response(405)
        self.send_header("Allow", "GET")
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = _not_allowed
