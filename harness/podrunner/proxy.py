"""The local backend's kube-proxy: each Service's ClusterIP, served at its loopback
address (network.py), forwards TCP connections to a Ready pod the Service selects.

kube-proxy programs iptables from EndpointSlices; here pod IPs are loopback addresses,
which EndpointSlices may not hold, so the proxy reads the Services and the pods the pod
runner runs, and picks a Ready pod for each connection (round robin) itself. A Service
without a Ready pod refuses the connection, as kube-proxy's REJECT rule does.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Mapping
from typing import Any

from gpulab import informer
from harness.podrunner.network import is_pod_address, service_address
from harness.podrunner.probes import resolve_port

_log = logging.getLogger("gpulab.podrunner.proxy")
Obj = dict[str, Any]


def selects(selector: Mapping[str, str], pod: Mapping[str, Any]) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    return not (pod.get("metadata") or {}).get("deletionTimestamp") and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def backends(
    service: Mapping[str, Any], port: Mapping[str, Any], pods: list[Obj], block: int
) -> list[tuple[str, int]]:
    """(pod IP, target port) of every Ready pod behind one Service port (pure)."""
    selector = (service.get("spec") or {}).get("selector") or {}
    out = []
    for pod in pods:
        ip = (pod.get("status") or {}).get("podIP")
        if not (selects(selector, pod) and ready(pod) and is_pod_address(block, ip)):
            continue
        target = port.get("targetPort", port["port"])
        for c in (pod.get("spec") or {}).get("containers") or []:
            try:
                number = resolve_port(target, c)
            except ValueError:
                continue
            out.append((ip, number))
            break
    return sorted(out)


class ServiceProxy:
    def __init__(self, api: Any, block: int, pods: informer.Store) -> None:
        self.block = block
        self.pods = pods
        self.services = informer.Informer(
            informer.ListWatch(api, informer.SERVICES),
            informer.Handlers(
                on_add=self._changed,
                on_update=lambda _o, n: self._changed(n),
                on_delete=self._removed,
            ),
            name="service-proxy",
        )
        self._loop = asyncio.new_event_loop()
        self._servers: dict[tuple[str, str, int], asyncio.base_events.Server] = {}
        self._rr = itertools.count()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="service-proxy-loop", daemon=True
        )

    def start(self) -> None:
        self._thread.start()
        self.services.start()

    def stop(self) -> None:
        self.services.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)

    def _listen_key(self, svc: Mapping[str, Any]) -> list[tuple[str, str, int, Obj]]:
        spec = svc.get("spec") or {}
        addr = service_address(self.block, spec.get("clusterIP") or "")
        if addr is None or not spec.get("selector"):
            return []
        key = informer.key_of(svc)
        return [
            (key, addr, int(p["port"]), p)
            for p in spec.get("ports") or []
            if p.get("protocol", "TCP") == "TCP"
        ]

    def _changed(self, svc: Obj) -> None:
        wanted = {(k, a, p): spec for k, a, p, spec in self._listen_key(svc)}
        asyncio.run_coroutine_threadsafe(self._reconcile(informer.key_of(svc), wanted), self._loop)

    def _removed(self, svc: Obj) -> None:
        asyncio.run_coroutine_threadsafe(self._reconcile(informer.key_of(svc), {}), self._loop)

    async def _reconcile(self, key: str, wanted: dict[tuple[str, str, int], Obj]) -> None:
        for listen in [k for k in self._servers if k[0] == key and k not in wanted]:
            self._servers.pop(listen).close()
        for listen in wanted:
            if listen in self._servers:
                continue
            _, addr, port = listen
            try:
                self._servers[listen] = await asyncio.start_server(
                    lambda r, w, listen=listen: self._forward(listen, r, w), addr, port
                )
            except OSError as exc:
                _log.warning("Service %s: cannot listen on %s:%d: %s", key, addr, port, exc)

    async def _forward(
        self,
        listen: tuple[str, str, int],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        svc = self.services.store.get(listen[0])
        port = next(
            (spec for k, a, p, spec in self._listen_key(svc or {}) if (k, a, p) == listen), None
        )
        targets = backends(svc or {}, port, self.pods.list(), self.block) if port else []
        if not targets:
            writer.close()
            return
        host, target = targets[next(self._rr) % len(targets)]
        try:
            up_reader, up_writer = await asyncio.open_connection(host, target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(
            _pipe(reader, up_writer), _pipe(up_reader, writer), return_exceptions=True
        )


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()
