"""Container probes (cf. kubelet ``pkg/probe`` and ``prober/worker.go``): httpGet, tcpSocket,
exec and grpc, with periodSeconds / initialDelaySeconds / timeoutSeconds /
successThreshold / failureThreshold as kubelet counts them."""

from __future__ import annotations

import socket
import ssl
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

Obj = dict[str, Any]


def resolve_port(port: Any, container: Mapping[str, Any]) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"port {port!r} is not a named port of container {container.get('name')!r}")


def run(
    probe: Mapping[str, Any],
    container: Mapping[str, Any],
    pod_ip: str,
    env: Mapping[str, str],
    cwd: str,
) -> tuple[bool, str]:
    """One probe attempt: (success, message for the Unhealthy Event)."""
    timeout = float(probe.get("timeoutSeconds", 1))
    try:
        if "httpGet" in probe:
            return _http(probe["httpGet"], container, pod_ip, timeout)
        if "tcpSocket" in probe:
            port = resolve_port(probe["tcpSocket"]["port"], container)
            host = probe["tcpSocket"].get("host") or pod_ip
            with socket.create_connection((host, port), timeout=timeout):
                return True, ""
        if "exec" in probe:
            done = subprocess.run(
                probe["exec"]["command"],
                env=dict(env),
                cwd=cwd,
                capture_output=True,
                timeout=timeout,
                check=False,
            )
            out = (done.stdout + done.stderr).decode(errors="replace").strip()
            return done.returncode == 0, out[:500]
        if "grpc" in probe:
            return _grpc(probe["grpc"], pod_ip, timeout)
    except (OSError, ValueError, subprocess.TimeoutExpired, httpx.HTTPError) as exc:
        return False, str(exc) or type(exc).__name__
    return False, f"unsupported probe {sorted(probe)}"


def _http(
    get: Mapping[str, Any], container: Mapping[str, Any], pod_ip: str, timeout: float
) -> tuple[bool, str]:
    port = resolve_port(get["port"], container)
    scheme = str(get.get("scheme", "HTTP")).lower()
    host = get.get("host") or pod_ip
    url = f"{scheme}://{host}:{port}{get.get('path', '/')}"
    headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
    headers.setdefault("User-Agent", "kube-probe/1.36")
    # kubelet does not verify the serving certificate of an HTTPS probe
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    response = httpx.get(url, headers=headers, timeout=timeout, verify=context)
    ok = 200 <= response.status_code < 400
    return ok, "" if ok else f"HTTP probe failed with statuscode: {response.status_code}"


def _grpc(spec: Mapping[str, Any], pod_ip: str, timeout: float) -> tuple[bool, str]:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"{pod_ip}:{int(spec['port'])}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(
                health_pb2.HealthCheckRequest(service=spec.get("service", "")), timeout=timeout
            )
        except grpc.RpcError as exc:
            return False, f"failed to connect service {pod_ip}:{spec['port']}: {exc.code().name}"
    ok = reply.status == health_pb2.HealthCheckResponse.SERVING
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return (
        ok,
        "" if ok else f"service unhealthy (responded with {name})",
    )


@dataclass
class Prober:
    """One probe of one container (kubelet's prober worker): call ``due`` and ``record``."""

    kind: str  # readiness | liveness | startup
    spec: Obj
    started_at: float  # monotonic time the container started
    successes: int = 0
    failures: int = 0
    next_at: float = 0.0
    result: bool | None = None  # None until a threshold is reached

    def __post_init__(self) -> None:
        self.next_at = self.started_at + float(self.spec.get("initialDelaySeconds", 0))

    def due(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) >= self.next_at

    def record(self, ok: bool, now: float | None = None) -> bool | None:
        """Count one attempt; return the probe's verdict when it changes."""
        now = time.monotonic() if now is None else now
        self.next_at = now + float(self.spec.get("periodSeconds", 10))
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if (
                self.successes >= int(self.spec.get("successThreshold", 1))
                and self.result is not True
            ):
                self.result = True
                return True
        else:
            self.failures, self.successes = self.failures + 1, 0
            if (
                self.failures >= int(self.spec.get("failureThreshold", 3))
                and self.result is not False
            ):
                self.result = False
                return False
        return None
