"""What the scheduling-chapter e2e tests share: their cluster, pods in and out, Events."""

from __future__ import annotations

import http.server
import itertools
import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from conftest import Cluster
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.framework.objects import manifest
from gpulab.schedulerplugins.apis import POD_GROUP_LABEL
from gpulab.wait import wait_for
from harness.ports import free_port

RECORDED = "cross-check: recorded by the test's extender"
SCHEDULER = "gpulab-scheduler"
Obj = dict[str, Any]


def create_pod(api: client.ApiClient, pod: Mapping[str, Any]) -> Obj:
    ns = pod["metadata"]["namespace"]
    created = client.CoreV1Api(api).create_namespaced_pod(ns, manifest(pod))
    return api.sanitize_for_serialization(created)


def read_pod(api: client.ApiClient, ns: str, name: str) -> Obj | None:
    try:
        return api.sanitize_for_serialization(client.CoreV1Api(api).read_namespaced_pod(name, ns))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def wait_bound(api: client.ApiClient, ns: str, name: str, timeout: float = 30) -> Obj:
    return wait_for(
        lambda: (p := read_pod(api, ns, name)) and p["spec"].get("nodeName") and p,
        timeout,
        f"pod {ns}/{name} to be bound",
    )


def events_about(api: client.ApiClient, ns: str, name: str, reason: str) -> list[Obj]:
    """core/v1 view of the Events about pod ``name`` with ``reason`` (any API wrote them)."""
    events = client.CoreV1Api(api).list_namespaced_event(
        ns, field_selector=f"involvedObject.name={name},reason={reason}"
    )
    return api.sanitize_for_serialization(events)["items"]


def wait_event(api: client.ApiClient, ns: str, name: str, reason: str, timeout: float = 30) -> Obj:
    return wait_for(
        lambda: (evs := events_about(api, ns, name, reason)) and evs[-1],
        timeout,
        f"a {reason} Event about pod {ns}/{name}",
    )


def delete_pods(api: client.ApiClient, ns: str, timeout: float = 60) -> None:
    core = client.CoreV1Api(api)
    core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(ns).items, timeout, f"pods of {ns} to go")


class GangWatch:
    """Watches a namespace's pods for the whole test and remembers, per pod group, when
    its bound count changed: a gang may pass through partial counts only while its
    Bindings are being made (``grace`` seconds), never stay partially bound. It also
    keeps every value each pod's ``status.nominatedNodeName`` took, in order."""

    def __init__(self, api: client.ApiClient, namespace: str, min_members: Mapping[str, int]):
        self.api = api
        self.namespace = namespace
        self.min_members = dict(min_members)
        self.bound: dict[str, set[str]] = {g: set() for g in min_members}
        self.history: dict[str, list[tuple[float, int]]] = {g: [(0.0, 0)] for g in min_members}
        self.nominated: dict[str, list[str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> GangWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _run(self) -> None:
        from gpulab.informer import PODS, SYNCED, ListWatch, follow

        lw = ListWatch(self.api, PODS, namespace=self.namespace)
        for delta in follow(lw, self._stop):
            if delta.type == SYNCED:
                continue
            pod = delta.obj
            group = (pod["metadata"].get("labels") or {}).get(POD_GROUP_LABEL)
            if group not in self.bound:
                continue
            name = pod["metadata"]["name"]
            nominated = self.nominated.setdefault(name, [""])
            value = (pod.get("status") or {}).get("nominatedNodeName") or ""
            if nominated[-1] != value:
                nominated.append(value)
            holds = delta.type != "DELETED" and bool(pod["spec"].get("nodeName"))
            before = len(self.bound[group])
            (self.bound[group].add if holds else self.bound[group].discard)(name)
            if len(self.bound[group]) != before:
                self.history[group].append((time.monotonic(), len(self.bound[group])))

    def count(self, group: str) -> int:
        return len(self.bound[group])

    def partial_spans(self, group: str, grace: float = 5.0) -> list[tuple[int, float]]:
        """(count, seconds) of every partial state that lasted longer than ``grace``
        (the current one up to now)."""
        want = self.min_members[group]
        spans = []
        steps = [*self.history[group], (time.monotonic(), -1)]
        for (t0, n), (t1, _) in itertools.pairwise(steps):
            if 0 < n < want and t1 - t0 > grace:
                spans.append((n, round(t1 - t0, 1)))
        return spans

    def assert_never_partial(self) -> None:
        problems = {g: self.partial_spans(g) for g in self.bound}
        assert not any(problems.values()), f"gangs stayed partially bound: {problems}"


class RecordingExtender:
    """A scheduler extender whose /filter records the NodeNames kube-scheduler found
    feasible, per pod, and rejects them all (nothing binds) unless ``fail`` is False; its
    /bind (when the scheduler's config names ``bindVerb``) records the node kube-scheduler
    chose and refuses the Binding, so the cluster stays as it was."""

    def __init__(self) -> None:
        self.seen: dict[str, list[str]] = {}
        self.chosen: dict[str, str] = {}
        self.fail = True
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                args = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path.endswith("/bind"):
                    key = f"{args['PodNamespace']}/{args['PodName']}"
                    recorder.chosen.setdefault(key, args["Node"])
                    self._reply({"Error": f"{RECORDED}: chose {args['Node']}"})
                    return
                meta = args["Pod"]["metadata"]
                names = list(args.get("NodeNames") or [])
                recorder.seen[f"{meta['namespace']}/{meta['name']}"] = names
                result = {"NodeNames": names, "FailedNodes": {}, "Error": ""}
                if recorder.fail:
                    result = {"NodeNames": [], "FailedNodes": dict.fromkeys(names, RECORDED)}
                self._reply({"Error": "", **result})

            def _reply(self, result: Mapping[str, Any]) -> None:
                body = json.dumps(result).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"


def start_peer_scheduler(
    cluster: Cluster, name: str, binary: Path, config: Mapping[str, Any], kubeconfig: Path
) -> None:
    """Start a kube-scheduler binary with ``config`` as one of the cluster's processes
    (``gpulab down`` stops it); return once its /healthz answers."""
    local = cluster.local
    path = local.dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**config, "clientConnection": {"kubeconfig": str(kubeconfig)}}))
    port = free_port()
    local.start_process(
        name,
        [
            str(binary),
            f"--config={path}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
        ],
        ports=[port],
    )
    local.wait_http(f"https://127.0.0.1:{port}/healthz", name, verify=False)
