"""Every HTTP endpoint the lab serves, fuzzed by one harness (tests/component/fuzzing.py).

Each server is started in-process as its command starts it (HTTPS where the manifests
serve HTTPS), each endpoint gets ``fuzzing.ROUNDS`` seeded hostile bodies (or hostile
queries, paths and methods for a GET endpoint) and must answer every one within the
deadline, inside its protocol, never with a 5xx or a dropped connection, every refusal
saying why and none written by an exception; afterwards it still answers its valid
example. ``test_every_served_endpoint_is_fuzzed`` keeps the table complete: it reads the
paths the manifests declare and the routes the servers register.
"""

from __future__ import annotations

import copy
import io
import json
import random
import ssl
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import fuzzing as fz
import httpx
import pytest
import uvicorn
import yaml
from starlette.routing import Mount, Route
from test_hami_extender import World, filter_args
from test_volcano_webhook import review as volcano_review

from gpulab.dashboard import server as dashboard
from gpulab.dashboard.hub import Hub
from gpulab.framework.scheduler import serve_healthz
from gpulab.gpuoperator import controller as gpuop
from gpulab.gpuoperator import dcgm
from gpulab.hami import annotations as ann
from gpulab.hami.routes import MAX_BODY as HAMI_MAX_BODY
from gpulab.hami.server import listen
from gpulab.informer import Store
from gpulab.kueue import api as kapi
from gpulab.kueue import visibility as kvis
from gpulab.kueue import webhook as kwebhook
from gpulab.kueue.metrics import Metrics as KueueMetrics
from gpulab.kueue.model import local_queue_from_obj, workload_from_obj
from gpulab.kueue.queue import Manager as QueueManager
from gpulab.trace import Tracer
from gpulab.volcano import objects as vo
from gpulab.volcano import server as vserver
from gpulab.volcano.webhooks.server import MAX_REQUEST_BODY, PATHS, Admission, routes
from gpulab.wait import wait_for
from harness import pki
from harness.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"


def load(path: Path) -> Any:
    return (
        yaml.safe_load(path.read_text()) if path.suffix == ".yaml" else json.loads(path.read_text())
    )


# -- servers, started as their commands start them --------------------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[pki.Pair, ssl.SSLContext]:
    d = tmp_path_factory.mktemp("certs")
    ca = pki.create_ca(d)
    pair = pki.issue(ca, d, "tls", "webhook", hosts=("127.0.0.1",))
    return pair, ssl.create_default_context(cafile=str(ca.cert))


def _client(url: str, verify: Any = True) -> httpx.Client:
    return httpx.Client(base_url=url, verify=verify, timeout=30)


def _uvicorn(app: Any) -> tuple[uvicorn.Server, int]:
    sock = listen(("127.0.0.1", 0), "--http_bind")
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    wait_for(lambda: server.started, 10, "uvicorn to start", interval=0.01)
    return server, sock.getsockname()[1]


@pytest.fixture(scope="module")
def kueue(certs: Any) -> Iterator[httpx.Client]:
    pair, verify = certs
    port = free_port()
    server = kwebhook.serve_in_thread(
        f"127.0.0.1:{port}", str(pair.cert), str(pair.key), kwebhook.Lookups(), threading.Event()
    )
    with _client(f"https://127.0.0.1:{port}", verify) as c:
        yield c
    server.should_exit = True


@pytest.fixture(scope="module")
def volcano(certs: Any) -> Iterator[httpx.Client]:
    pair, verify = certs
    queues = Store()
    queues.replace([vo.queue("default"), vo.queue("test", state="Closed")])
    ready = threading.Event()
    ready.set()
    admission = Admission(queues, Tracer("vc-webhook-manager", stream=io.StringIO()), "volcano")
    port = free_port()
    server = vserver.serve(
        f"127.0.0.1:{port}",
        "--port",
        routes(admission, list(PATHS), ready),
        str(pair.cert),
        str(pair.key),
    )
    with _client(f"https://127.0.0.1:{port}", verify) as c:
        yield c
    server.should_exit = True


@pytest.fixture(scope="module")
def volcano_probes() -> Iterator[httpx.Client]:
    """vc-scheduler's --healthz-address and --listen-address routes on one server."""
    ready = threading.Event()
    ready.set()
    port = free_port()
    from prometheus_client import CollectorRegistry

    server = vserver.serve(
        f"127.0.0.1:{port}",
        "--healthz-address",
        [
            Route("/healthz", vserver.healthz(ready)),
            Route("/metrics", vserver.metrics(CollectorRegistry())),
        ],
    )
    with _client(f"http://127.0.0.1:{port}") as c:
        yield c
    server.should_exit = True


class HamiWorld:
    def __init__(self) -> None:
        self.world = World()
        self.pod = self.world.add_vgpu_pod("vgpu-a", mem=1000, cores=1)


@pytest.fixture(scope="module")
def hami() -> Iterator[tuple[httpx.Client, HamiWorld]]:
    world = HamiWorld()
    server, port = _uvicorn(world.world.app)
    with httpx.Client(
        base_url=f"http://127.0.0.1:{port}",
        timeout=30,
        limits=httpx.Limits(max_keepalive_connections=0),  # see test_hami_extender.serve
    ) as c:
        yield c, world
    server.should_exit = True


def _prometheus(registry: Any) -> Iterator[httpx.Client]:
    from prometheus_client import start_http_server

    port = free_port()
    server, _ = start_http_server(port, "127.0.0.1", registry=registry)
    with _client(f"http://127.0.0.1:{port}") as c:
        yield c
    server.shutdown()


@pytest.fixture(scope="module")
def hami_metrics(hami: Any) -> Iterator[httpx.Client]:
    yield from _prometheus(hami[1].world.metrics.registry)


@pytest.fixture(scope="module")
def kueue_metrics() -> Iterator[httpx.Client]:
    yield from _prometheus(KueueMetrics().registry)


@pytest.fixture(scope="module")
def operator_metrics() -> Iterator[httpx.Client]:
    yield from _prometheus(gpuop.OperatorMetrics().registry)


@pytest.fixture(scope="module")
def operator_probes() -> Iterator[httpx.Client]:
    synced = threading.Event()
    synced.set()
    port = free_port()
    server = gpuop.serve_probes(f"127.0.0.1:{port}", synced)
    with _client(f"http://127.0.0.1:{port}") as c:
        yield c
    server.shutdown()


class _NoGPUs:
    def samples(self) -> list[Any]:
        return []


@pytest.fixture(scope="module")
def dcgm_exporter() -> Iterator[httpx.Client]:
    port = free_port()
    server = dcgm.serve(("127.0.0.1", port), dcgm.default_counters(), _NoGPUs(), "node")  # type: ignore[arg-type]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with _client(f"http://127.0.0.1:{port}") as c:
        yield c
    server.shutdown()


@pytest.fixture(scope="module")
def scheduler_probes() -> Iterator[httpx.Client]:
    """gpulab-scheduler's (and the Coscheduling profile's) /healthz and /readyz."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    ready = threading.Event()
    ready.set()
    server = serve_healthz(sock, ready)
    with _client(f"http://127.0.0.1:{sock.getsockname()[1]}") as c:
        yield c
    server.shutdown()


@pytest.fixture(scope="module")
def dashboard_app() -> Iterator[httpx.Client]:
    hub = Hub(api=None)  # type: ignore[arg-type]  # not started: the routes over empty views
    server, port = _uvicorn(dashboard.app(hub))
    with _client(f"http://127.0.0.1:{port}") as c:
        yield c
    server.should_exit = True


# -- the Kueue visibility API: an aggregated API kube-apiserver proxies to -------------------

# (name, LocalQueue, priority, creationTimestamp) in the order the ClusterQueue's heap pops
# them (BestEffortFIFO: priority, then creation); created out of that order on purpose
PENDING = [
    ("w-high", "lq-b", 100, "2026-01-01T00:00:05Z"),
    ("w-mid", "lq-b", 50, "2026-01-01T00:00:09Z"),
    ("w-old", "lq-a", 0, "2026-01-01T00:00:01Z"),
    ("w-new", "lq-a", 0, "2026-01-01T00:00:03Z"),
    ("w-last", "lq-a", 0, "2026-01-01T00:00:07Z"),
]
VIS = f"/apis/{kvis.GROUP}"
FRONT_PROXY_CN = "front-proxy-client"  # kube-apiserver's --requestheader-allowed-names


def visibility_queues() -> QueueManager:
    """The controller's queue manager with one ClusterQueue, two LocalQueues in namespace
    ``team`` and PENDING's Workloads, built from the objects the informers deliver."""
    queues = QueueManager()
    queues.add_or_update_cluster_queue("cq", kapi.BEST_EFFORT_FIFO, {}, None)
    for lq in ("lq-a", "lq-b"):
        obj = {"metadata": {"name": lq, "namespace": "team"}, "spec": {"clusterQueue": "cq"}}
        queues.add_or_update_local_queue(local_queue_from_obj(obj))
    for name, lq, priority, created in PENDING:
        meta = {"name": name, "namespace": "team", "uid": f"uid-{name}"}
        meta["creationTimestamp"] = created
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": name}]
        spec = {"queueName": lq, "priority": priority}
        spec["podSets"] = [{"name": "main", "count": 1, "template": {"spec": GPU_SPEC}}]
        queues.add_or_update_workload(workload_from_obj({"metadata": meta, "spec": spec}, "cq"))
    return queues


def rbac(user: str, groups: list[str], extra: dict[str, list[str]], attrs: Any) -> bool:
    """Stands in for the SubjectAccessReview ``visibility.subject_access_review`` sends to
    kube-apiserver: alice holds the ClusterQueue viewer role cluster-wide and the
    LocalQueue viewer role in namespace ``team`` only (so other namespaces are 403)."""
    if user != "alice" or attrs["verb"] != "get":
        return False
    return attrs["resource"] == "clusterqueues" or attrs["namespace"] == "team"


@pytest.fixture(scope="module")
def visibility_server(
    certs: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, pki.KeyPair, pki.KeyPair]]:
    """As ``start_visibility`` starts it: the webhooks' serving certificate, the front
    proxy's CA and allowed names (ConfigMap extension-apiserver-authentication)."""
    pair, _ = certs
    d = tmp_path_factory.mktemp("front-proxy")
    front = pki.create_ca(d, "front-proxy-ca", stem="front-proxy-ca")
    proxy = pki.issue(front, d, "front-proxy-client", FRONT_PROXY_CN, client=True)
    port = free_port()
    server = kvis.serve_in_thread(
        visibility_queues(),
        "127.0.0.1",
        port,
        str(pair.cert),
        str(pair.key),
        front.cert.read_text(),
        [FRONT_PROXY_CN],
        rbac,
    )
    yield f"https://127.0.0.1:{port}", proxy, front
    server.shutdown()


def aggregator(url: str, cert: pki.KeyPair | None, user: str = "alice") -> httpx.Client:
    """A client as kube-apiserver's aggregator is one: it does not verify the server (the
    APIServices' insecureSkipTLSVerify), presents ``cert`` and names the user it proxies for
    in X-Remote-* headers (which, without the certificate, must count for nothing)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if cert is not None:
        ctx.load_cert_chain(cert.cert, cert.key)
    headers = {"X-Remote-User": user, "X-Remote-Group": "system:authenticated"}
    return httpx.Client(base_url=url, verify=ctx, timeout=30, headers=headers)


@pytest.fixture(scope="module")
def kueue_visibility(visibility_server: tuple[str, pki.KeyPair, Any]) -> Iterator[httpx.Client]:
    with aggregator(*visibility_server[:2]) as c:
        yield c


@pytest.fixture(scope="module")
def kueue_visibility_anonymous(
    visibility_server: tuple[str, pki.KeyPair, Any],
) -> Iterator[httpx.Client]:
    """No client certificate, and X-Remote-Group: system:masters claimed anyway."""
    with aggregator(visibility_server[0], None) as c:
        c.headers["X-Remote-Group"] = "system:masters"
        yield c


# -- valid examples -------------------------------------------------------------------------


def _review_of(obj: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    body = load(FIXTURES / "kueue" / "admission-review-job.json")
    body["request"]["object"] = obj
    body["request"]["operation"] = operation
    if operation == "UPDATE":
        body["request"]["oldObject"] = copy.deepcopy(obj)
    return body


GPU_SPEC = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
QUEUED = {kapi.QUEUE_LABEL: "lq"}


def kueue_examples() -> dict[str, Any]:
    job_review = load(FIXTURES / "kueue" / "admission-review-job.json")
    cq = {
        "apiVersion": kapi.API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": "cq"},
        "spec": {
            "cohortName": "c",
            "resourceGroups": [
                {
                    "coveredResources": ["nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": "a100",
                            "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4}],
                        }
                    ],
                }
            ],
        },
    }
    workload = {
        "apiVersion": kapi.API_VERSION,
        "kind": "Workload",
        "metadata": {"name": "w", "namespace": "team"},
        "spec": {
            "queueName": "lq",
            "podSets": [{"name": "main", "count": 1, "template": {"spec": GPU_SPEC}}],
        },
    }
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": QUEUED}}
    pod["spec"] = GPU_SPEC
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "labels": QUEUED},
        "spec": {"replicas": 2, "template": {"metadata": {"labels": {"a": "b"}}, "spec": GPU_SPEC}},
    }
    return {
        "/mutate-batch-v1-job": job_review,
        "/validate-batch-v1-job": _review_of(job_review["request"]["object"], "UPDATE"),
        "/mutate--v1-pod": _review_of(pod),
        "/validate--v1-pod": _review_of(pod, "UPDATE"),
        "/mutate-apps-v1-deployment": _review_of(deployment),
        "/validate-apps-v1-deployment": _review_of(deployment, "UPDATE"),
        "/mutate-apps-v1-statefulset": _review_of({**deployment, "kind": "StatefulSet"}),
        "/validate-apps-v1-statefulset": _review_of({**deployment, "kind": "StatefulSet"}),
        "/validate-kueue-x-k8s-io-v1beta2-clusterqueue": _review_of(cq, "UPDATE"),
        "/validate-kueue-x-k8s-io-v1beta2-cohort": _review_of({**cq, "kind": "Cohort"}),
        "/validate-kueue-x-k8s-io-v1beta2-resourceflavor": _review_of(
            {"metadata": {"name": "f"}, "spec": {"nodeLabels": {"a": "b"}, "nodeTaints": []}}
        ),
        "/validate-kueue-x-k8s-io-v1beta2-workload": _review_of(workload, "UPDATE"),
        kwebhook.CONVERT_PATH: load(FIXTURES / "kueue" / "conversion-review-clusterqueue.json"),
    }


SAMPLES = ROOT / "manifests" / "volcano" / "samples"


VOLCANO_OBJECTS: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {
    "/jobs/mutate": ("jobs", lambda: load(SAMPLES / "job.yaml")),
    "/jobs/validate": ("jobs", lambda: load(SAMPLES / "job.yaml")),
    "/podgroups/validate": ("podgroups", lambda: vo.podgroup("pg", "default")),
    "/queues/mutate": ("queues", lambda: load(SAMPLES / "queue.yaml")),
    "/queues/validate": ("queues", lambda: load(SAMPLES / "queue.yaml")),
}
# the shapes issue 35 found answered with a 500, and a word each refusal must carry
VOLCANO_WRONG_TYPES = {
    "jobs": [
        (("spec", "minAvailable"), "abc", "spec.minAvailable"),
        (("spec", "tasks"), {}, "spec.tasks"),
        (("spec", "policies"), 1, "spec.policies"),
        (("spec", "plugins"), ["ssh"], "spec.plugins"),
        (("spec", "maxRetry"), 2**40, "spec.maxRetry"),
        (("metadata", "name"), 7, "metadata.name"),
    ],
    "podgroups": [
        (("spec", "minMember"), "3", "spec.minMember"),
        (("spec", "minResources"), {"nvidia.com/gpu": "lots"}, "quantities must match"),
        (("spec", "queue"), ["default"], "spec.queue"),
    ],
    "queues": [
        (("spec", "weight"), 1.5, "spec.weight"),
        (("spec", "capability"), {"cpu": True}, "quantities must match"),
        (("spec", "reclaimable"), "yes", "spec.reclaimable"),
    ],
}


def volcano_extra(route: str) -> fz.Extra:
    """Volcano's own hostile shapes, each refused with a named reason."""
    resource, make = VOLCANO_OBJECTS[route]

    def extra(rng: random.Random) -> tuple[bytes, str | None]:
        body = volcano_review(make(), rng.choice(["CREATE", "UPDATE"]), resource)
        request = body["request"]
        roll = rng.random()
        if roll < 0.15:
            depth = rng.choice([2_000, 100_000])
            return b'{"request": ' + b"[" * depth + b"]" * depth + b"}", "nests deeper"
        if roll < 0.35:
            request["operation"] = rng.choice(["DELETE", "CONNECT", "create", "", "PATCH"])
            if route == "/queues/validate" and request["operation"] == "DELETE":
                request["operation"] = "CONNECT"
            return json.dumps(body).encode(), "operation"
        if roll < 0.5:
            other = rng.choice([r for r in ("jobs", "podgroups", "queues") if r != resource])
            request["resource"]["resource"] = other
            return json.dumps(body).encode(), "expect resource to be"
        if roll < 0.65:
            request["object"]["kind"] = rng.choice(["Pod", "Deployment", "Queue", "Job"])
            request["object"]["apiVersion"] = rng.choice(["v1", "apps/v1", "batch/v1"])
            return json.dumps(body).encode(), "expected"
        where, value, word = rng.choice(VOLCANO_WRONG_TYPES[resource])
        target = request["object"]
        for key in where[:-1]:
            target = target.setdefault(key, {})
        target[where[-1]] = value
        return json.dumps(body).encode(), word

    return extra


def hami_filter_extra(pod: dict[str, Any]) -> fz.Extra:
    """Filter bodies a user can write: ghost nodes, bad quantities, bad annotations."""

    def extra(rng: random.Random) -> tuple[bytes, str | None]:
        args = filter_args(copy.deepcopy(pod))
        choice = rng.random()
        if choice < 0.3:
            args["NodeNames"] = [f"ghost-{rng.randrange(1000)}" for _ in range(rng.randrange(5))]
        elif choice < 0.6:
            ctr = args["Pod"]["spec"]["containers"][0]
            ctr["resources"]["limits"]["nvidia.com/gpu"] = rng.choice(["abc", "-3", "1.5", 7, "99"])
        elif choice < 0.8:
            args["Pod"]["metadata"]["annotations"] = {
                "nvidia.com/use-gpuuuid": rng.choice(["", ",,,", "GPU-gpu-node-1-00", None, 7]),
                "hami.io/node-scheduler-policy": rng.choice(["binpack", "x" * 300, "", ["spread"]]),
            }
        else:
            meta = args["Pod"]["metadata"]
            meta[rng.choice(["name", "namespace", "uid", "annotations"])] = rng.choice(fz.JUNK)
        return json.dumps(args).encode(), None

    return extra


def _summary_in_queue_order(items: Any) -> None:
    """Each item is the Workload at its positionInClusterQueue of PENDING, in that order,
    with its LocalQueue position, priority and LocalQueue name."""
    if not isinstance(items, list):
        raise fz.OutOfProtocol("items is not a list")
    last = -1
    for item in items:
        at = item["positionInClusterQueue"]
        if not isinstance(at, int) or not last < at < len(PENDING):
            raise fz.OutOfProtocol(f"positionInClusterQueue {at!r} after {last}")
        name, lq, priority, _ = PENDING[at]
        in_lq = [n for n, q, _, _ in PENDING if q == lq].index(name)
        got = (item["metadata"]["name"], item["localQueueName"], item["priority"])
        if got != (name, lq, priority) or item["positionInLocalQueue"] != in_lq:
            raise fz.OutOfProtocol(f"{got} at {at}/{item['positionInLocalQueue']}")
        last = at


def visibility_answer(resp: httpx.Response) -> fz.Answer:
    """What kube-apiserver's aggregator passes on: a PendingWorkloadsSummary whose items
    are in queue order, a discovery document, or a Status whose code is the HTTP status
    and whose message says what was wrong."""
    if resp.headers.get("content-type") != "application/json":
        raise fz.OutOfProtocol(f"Content-Type {resp.headers.get('content-type')!r}")
    if resp.request.method == "HEAD":  # no body by definition: the GET's Status, unsent
        if resp.status_code not in (401, 405):
            raise fz.OutOfProtocol(f"HEAD answered {resp.status_code}")
        return fz.Answer(False, resp.reason_phrase)
    body = fz._json(resp)
    if not isinstance(body, dict):
        raise fz.OutOfProtocol("not an object")
    if resp.status_code == 200:
        if body.get("kind") in ("APIGroupList", "APIGroup", "APIResourceList"):
            return fz.Answer(True)
        versions = {f"{kvis.GROUP}/{v}" for v in kvis.VERSIONS}
        if body.get("kind") != "PendingWorkloadsSummary" or body.get("apiVersion") not in versions:
            raise fz.OutOfProtocol(f"a 200 with {body.get('kind')!r} {body.get('apiVersion')!r}")
        _summary_in_queue_order(body["items"])
        return fz.Answer(True)
    status = (body.get("kind"), body.get("apiVersion"), body.get("status"), body.get("code"))
    if status != ("Status", "v1", "Failure", resp.status_code) or resp.status_code not in (
        400,
        401,
        403,
        404,
        405,
    ):
        raise fz.OutOfProtocol(f"HTTP {resp.status_code} with {status}")
    if not isinstance(body.get("message"), str) or not isinstance(body.get("reason"), str):
        raise fz.OutOfProtocol("a Status without a message and a reason")
    return fz.Answer(False, body["message"])


def visibility_refusal(resp: httpx.Response) -> fz.Answer:
    """Without the front proxy's certificate: 401 or 403, in a Status, whatever is asked."""
    answer = visibility_answer(resp)
    if answer.accepted or resp.status_code not in (401, 403):
        raise fz.OutOfProtocol(f"HTTP {resp.status_code} without the front proxy's certificate")
    return answer


def _parse_error(value: str, why: str = "invalid syntax") -> str:
    return f"strconv.ParseInt: parsing {kvis.go_quote(value)}: {why}"


# limit/offset values and the refusal each gets (None: answered), as upstream's parameter
# codec (strconv.ParseInt) words them
PARAMS: list[tuple[str, str | None]] = [
    *((v, None) for v in ("-1", "0", "1", "3", "1000000000", str(2**63 - 1), str(-(2**63)))),
    *((v, None) for v in ("+2", "007", "-0")),
    *((v, _parse_error(v)) for v in ("abc", "1e9", "", " 5", "5_0", "1.5", "0x10", "٣", "--1")),
    *((v, _parse_error(v)) for v in ("+", "\x00", "%00", "NaN", "1" * 4999 + "x")),
    *(
        (v, _parse_error(v, "value out of range"))
        for v in (str(2**63), str(-(2**63) - 1), "9" * 30, "1" * 5000)
    ),
]
# names (decoded) as a path segment, %-escaped: "..", NUL, 4,000 characters, not UTF-8
NAMES = ["..", ".", "\x00", "a" * 4000, "💥", "cq\n", "../cq", "%", "\udcff", " "]
NOT_FOUND_ANYWHERE = "the server could not find the requested resource"


def segment(text: str) -> str:
    """``text`` as one %-escaped path segment; dots too, or the client would resolve a
    ``..`` segment before sending it."""
    return quote(text, safe="", errors="surrogateescape").replace(".", "%2E")


def visibility_extra(version: str, namespaced: bool) -> fz.Extra:
    """Hostile URLs for one pendingworkloads route: limit/offset values (repeated: the
    first counts), other names and namespaces, other versions and resources."""
    base = f"{VIS}/{version}"

    def route(ns: str, name: str) -> str:
        where = f"namespaces/{segment(ns)}/localqueues" if namespaced else "clusterqueues"
        return f"{base}/{where}/{segment(name)}/pendingworkloads"

    home = route("team", "lq-a" if namespaced else "cq")

    def extra(rng: random.Random) -> tuple[bytes, str | None]:
        roll = rng.random()
        if roll < 0.5:
            (first, word), (second, _) = rng.choice(PARAMS), rng.choice(PARAMS)
            param = rng.choice(["limit", "offset"])
            query = f"{param}={segment(first)}"
            if rng.random() < 0.3:
                query += f"&{param}={segment(second)}"
            return f"{home}?{query}".encode(), word
        if roll < 0.8:
            name = rng.choice(NAMES)
            if "/" in name:  # decoded, it is more segments: a path nothing serves (as in Go)
                word = NOT_FOUND_ANYWHERE
            elif namespaced and rng.random() < 0.5:  # alice may not read other namespaces
                return route(name, "lq-a").encode(), f"in the namespace {kvis.go_quote(name)}"
            else:
                kind = "localqueue" if namespaced else "clusterqueue"
                word = f"{kind}.{kvis.GROUP} {kvis.go_quote(name)} not found"
            return route("team", name).encode(), word
        other = rng.choice(
            [
                home.replace(version, rng.choice(["v1", "v1beta3", "v1alpha1", "V1BETA2"])),
                home.replace("pendingworkloads", rng.choice(["runningworkloads", "workloads"])),
                home + "/x",
                f"{base}/localqueues/lq-a/pendingworkloads",  # namespaced, without one
                f"{base}/namespaces/team/clusterqueues/cq/pendingworkloads",
                f"{base}/workloads/w-high",
            ]
        )
        return other.encode(), NOT_FOUND_ANYWHERE

    return extra


def visibility_endpoints(judge: fz.Judge, authenticated: bool) -> list[fz.Endpoint]:
    """Every path the visibility server serves: discovery, and per version its two
    pendingworkloads routes (with their own hostile URLs, when authenticated)."""
    out = [
        fz.Endpoint(path, None, judge, method="GET", example_accepted=authenticated)
        for path in ("/apis", VIS)
    ]
    for version in kvis.VERSIONS:
        out.append(
            fz.Endpoint(
                f"{VIS}/{version}", None, judge, method="GET", example_accepted=authenticated
            )
        )
        for namespaced, where in (
            (False, "clusterqueues/cq"),
            (True, "namespaces/team/localqueues/lq-a"),
        ):
            out.append(
                fz.Endpoint(
                    f"{VIS}/{version}/{where}/pendingworkloads",
                    None,
                    judge,
                    method="GET",
                    extra=visibility_extra(version, namespaced) if authenticated else None,
                    example_accepted=authenticated,
                )
            )
    return out


# -- the table ------------------------------------------------------------------------------


# server fixture -> endpoints; every endpoint the lab serves is here once
def table(hami_pod: dict[str, Any] | None = None) -> dict[str, list[fz.Endpoint]]:
    pod = hami_pod or load(FIXTURES / "hami" / "filter_args.json")["Pod"]
    kueue_post = [
        fz.Endpoint(
            path,
            body,
            fz.conversion_review if path == kwebhook.CONVERT_PATH else fz.admission_review,
            max_body=kwebhook.MAX_BODY,
        )
        for path, body in kueue_examples().items()
    ]
    return {
        "kueue": [
            *kueue_post,
            fz.Endpoint("/healthz", None, fz.get(), method="GET"),
            fz.Endpoint("/readyz", None, fz.get(), method="GET"),
        ],
        "volcano": [
            *(
                fz.Endpoint(
                    path,
                    volcano_review(make(), "CREATE", resource),
                    fz.admission_review,
                    max_body=MAX_REQUEST_BODY,
                    extra=volcano_extra(path),
                )
                for path, (resource, make) in VOLCANO_OBJECTS.items()
            ),
            fz.Endpoint("/healthz", None, fz.get(), method="GET"),
        ],
        "volcano_probes": [
            fz.Endpoint("/healthz", None, fz.get(), method="GET"),
            fz.Endpoint("/metrics", None, fz.get(), method="GET"),
        ],
        "hami": [
            fz.Endpoint(
                "/filter",
                filter_args(pod),
                fz.extender_filter,
                max_body=HAMI_MAX_BODY,
                extra=hami_filter_extra(pod),
            ),
            fz.Endpoint(
                "/bind",
                load(FIXTURES / "hami" / "captured_bind_args.json"),
                fz.extender_bind,
                max_body=HAMI_MAX_BODY,
                example_accepted=False,  # kube-scheduler's capture: its pod is not here
            ),
            fz.Endpoint(
                "/webhook",
                load(FIXTURES / "hami" / "admission_review_gpu.json"),
                fz.admission_review_200,
                max_body=HAMI_MAX_BODY,
            ),
            fz.Endpoint("/healthz", None, fz.get(), method="GET"),
            fz.Endpoint("/readyz", None, fz.get(), method="GET"),
        ],
        "hami_metrics": [fz.Endpoint("/metrics", None, fz.get(), method="GET")],
        "kueue_metrics": [fz.Endpoint("/metrics", None, fz.get(), method="GET")],
        "operator_metrics": [fz.Endpoint("/metrics", None, fz.get(), method="GET")],
        "operator_probes": [
            fz.Endpoint("/healthz", None, fz.get(), method="GET"),
            fz.Endpoint("/readyz", None, fz.get(), method="GET"),
        ],
        "dcgm_exporter": [
            fz.Endpoint("/metrics", None, fz.get(), method="GET"),
            fz.Endpoint("/health", None, fz.get(), method="GET"),
        ],
        "scheduler_probes": [
            fz.Endpoint("/healthz", None, fz.get(), method="GET"),
            fz.Endpoint("/readyz", None, fz.get(), method="GET"),
        ],
        "dashboard_app": [
            fz.Endpoint("/", None, fz.get(), method="GET"),
            fz.Endpoint("/static/app.js", None, fz.get(), method="GET"),
            fz.Endpoint("/api/diagram", None, fz.get(), method="GET"),
            # an unknown pod is a 404 that says so: the route's refusal
            fz.Endpoint("/api/explain/default/nope", None, fz.get((200, 404)), method="GET"),
        ],
        "kueue_visibility": visibility_endpoints(visibility_answer, authenticated=True),
        "kueue_visibility_anonymous": visibility_endpoints(visibility_refusal, authenticated=False),
    }


CASES = [(server, ep) for server, eps in table().items() for ep in eps]


@pytest.mark.parametrize(
    ("server", "index"),
    [(s, i) for s, eps in table().items() for i in range(len(eps))],
    ids=[f"{s}:{ep.method} {ep.path}" for s, ep in CASES],
)
def test_endpoint_survives_hostile_requests(
    server: str, index: int, request: pytest.FixtureRequest
) -> None:
    fixture = request.getfixturevalue(server)
    if server == "hami":
        client, world = fixture
        endpoint = table(world.pod)[server][index]
    else:
        client, endpoint = fixture, table()[server][index]
    report = fz.run(client, endpoint)
    # a GET endpoint that answers any query (metrics, probes) refuses only what it must;
    # one with its own hostile URLs has both answers to give
    report.check(
        both_paths=endpoint.extra is not None
        or (endpoint.method == "POST" and endpoint.path != "/bind")
    )
    if endpoint.method == "POST":
        assert report.counts["oversize"] == fz.ROUNDS // 200 + (fz.ROUNDS % 200 > 7)


def test_the_hami_extender_still_schedules_after_the_storm(
    hami: tuple[httpx.Client, HamiWorld],
) -> None:
    """And its memory stays bounded: a warm-up storm, then a measured one."""
    client, hw = hami
    tracemalloc.start()
    try:
        for seed in ("warm-up", "storm"):
            if seed == "storm":  # caches, pools and lazy imports are in place
                baseline = tracemalloc.get_traced_memory()[0]
            for endpoint in table(hw.pod)["hami"][:3]:
                fz.run(client, endpoint, rounds=300, seed=seed).check(both_paths=False)
        grown = tracemalloc.get_traced_memory()[0] - baseline
    finally:
        tracemalloc.stop()
    assert grown < 4 << 20, f"memory grew by {grown / 2**20:.1f} MiB"
    hw.world.cluster.pods.pop(("default", "vgpu-a"), None)
    clean = hw.world.add_vgpu_pod("after", mem=1000, cores=1)
    result = client.post("/filter", json=filter_args(clean)).json()
    assert result["NodeNames"] and ann.ASSIGNED_NODE in hw.world.annotations("after")


def test_the_dashboard_stream_answers_hostile_queries_with_a_snapshot(
    dashboard_app: httpx.Client,
) -> None:
    """/api/stream never ends: read its first event per request."""
    rng = random.Random("gpulab-fuzz-stream")
    for _ in range(50):
        query = rng.choice(fz.HOSTILE_QUERIES)
        with dashboard_app.stream("GET", "/api/stream" + query, timeout=5) as resp:
            assert resp.status_code == 200
            first = next(resp.iter_text())
            assert first.startswith("retry:") and "event: snapshot" in first


# -- inventory: every served endpoint is in the table --------------------------------------


def declared_in_manifests() -> set[str]:
    """Paths the manifests declare: webhook configurations' and conversion paths, the
    extender's urlPrefix + verbs, probe paths and prometheus.io/path annotations."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            service = node.get("service")
            if isinstance(service, dict) and isinstance(service.get("path"), str):
                found.add(service["path"])
            get = node.get("httpGet")
            if isinstance(get, dict) and isinstance(get.get("path"), str):
                found.add(get["path"])
            for key in ("filterVerb", "bindVerb", "prioritizeVerb", "preemptVerb"):
                if isinstance(node.get(key), str):
                    found.add("/" + node[key])
            path = node.get("prometheus.io/path")
            if isinstance(path, str):
                found.add(path)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, str) and "urlPrefix" in node:  # config embedded in a ConfigMap
            for doc in yaml.safe_load_all(node):
                walk(doc)

    for path in sorted((ROOT / "manifests").rglob("*.yaml")):
        if "samples" in path.parts:
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            walk(doc)
    return found


# an APIService's group -> the discovery document its server answers for a version
AGGREGATED = {kvis.GROUP: kvis.discovery}


def aggregated_apis() -> set[str]:
    """Paths the APIServices in manifests/ make kube-apiserver proxy: each group/version,
    and the route of each resource its server's discovery lists with a verb."""
    found: set[str] = set()
    for path in sorted((ROOT / "manifests").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict) or doc.get("kind") != "APIService":
                continue
            group, version = doc["spec"]["group"], doc["spec"]["version"]
            base = f"/apis/{group}/{version}"
            found.add(base)
            assert group in AGGREGATED, f"{path.name}: no server known for APIService {group}"
            for res in (AGGREGATED[group](base) or {}).get("resources", []):
                if res["verbs"]:
                    parent, _, sub = res["name"].partition("/")
                    scope = "/namespaces/{namespace}" if res["namespaced"] else ""
                    found.add(f"{base}{scope}/{parent}/{{name}}/{sub}".rstrip("/"))
    return found


def registered_routes() -> dict[str, set[str]]:
    """Routes each of the lab's Starlette apps registers, by the table's server name.
    The ``http.server`` handlers (probes, dcgm-exporter, prometheus_client) have no route
    table to read: their paths come from the manifests' probes and annotations."""
    from gpulab.hami.metrics import ExtenderMetrics
    from gpulab.hami.routes import build_app
    from gpulab.hami.webhook import WebhookConfig

    hw = World()
    hami = build_app(hw.scheduler, WebhookConfig(scheduler_name="x"), ExtenderMetrics(hw.scheduler))
    apps = {
        "kueue": kwebhook.make_app().routes,
        "hami": hami.routes,
        "dashboard_app": dashboard.app(Hub(api=None)).routes,  # type: ignore[arg-type]
        "volcano": routes(
            Admission(Store(), Tracer("x", stream=io.StringIO()), "volcano"),
            list(PATHS),
            threading.Event(),
        ),
    }
    return {name: {r.path for r in rs if isinstance(r, Route | Mount)} for name, rs in apps.items()}


def fuzzed(path: str, served: set[str]) -> bool:
    if path in served:
        return True
    # a route with parameters or a mount is covered by a concrete path under it
    prefix = path.split("{")[0].rstrip("/")
    return bool(prefix) and any(p.startswith(prefix + "/") for p in served)


def test_every_served_endpoint_is_fuzzed() -> None:
    fuzzed_by = {server: {ep.path for ep in eps} for server, eps in table().items()}
    fuzzed_by["dashboard_app"].add("/api/stream")  # its own test: a stream never ends
    everywhere = set().union(*fuzzed_by.values())
    declared = declared_in_manifests()
    assert {"/webhook", "/filter", "/bind", "/convert", "/jobs/validate"} <= declared
    missing = [f"{p} (declared in manifests/)" for p in sorted(declared) if p not in everywhere]
    aggregated = aggregated_apis()
    assert f"{VIS}/v1beta2/clusterqueues/{{name}}/pendingworkloads" in aggregated
    # by a client the server lets in: an anonymous fuzz never gets past authentication
    answered = {ep.path for eps in table().values() for ep in eps if ep.example_accepted}
    missing += [
        f"{p} (an APIService in manifests/)"
        for p in sorted(aggregated)  # a group/version itself (discovery) exactly
        if not (p in answered if "{" not in p else fuzzed(p, answered))
    ]
    for server, paths in registered_routes().items():
        missing += [
            f"{p} (registered by {server})"
            for p in sorted(paths)
            if not fuzzed(p, fuzzed_by[server])
        ]
    assert not missing, f"served but not in the fuzz table of {__file__}: {missing}"


def test_the_inventory_names_an_endpoint_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    full = table()
    monkeypatch.setattr(
        sys.modules[__name__], "table", lambda *_: {**full, "volcano": full["volcano"][1:]}
    )
    with pytest.raises(AssertionError, match=r"/jobs/mutate \(registered by volcano\)"):
        test_every_served_endpoint_is_fuzzed()


def test_the_inventory_names_an_aggregated_api_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    full = table()
    v1beta1 = [ep for ep in full["kueue_visibility"] if "/v1beta1" not in ep.path]
    monkeypatch.setattr(
        sys.modules[__name__],
        "table",
        lambda *_: {**full, "kueue_visibility": v1beta1},
    )
    with pytest.raises(AssertionError) as failed:
        test_every_served_endpoint_is_fuzzed()
    assert f"{VIS}/v1beta1 (an APIService in manifests/)" in str(failed.value)
    assert f"{VIS}/v1beta1/namespaces/{{namespace}}/localqueues/{{name}}/pendingworkloads" in str(
        failed.value
    )


@pytest.mark.parametrize("server", ["scheduler_probes", "operator_probes", "dcgm_exporter"])
@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"])
def test_a_probe_server_refuses_other_methods_with_405(
    server: str, method: str, request: pytest.FixtureRequest
) -> None:
    """Found by the fuzz: http.server answered 501 Not Implemented (a 5xx)."""
    client = request.getfixturevalue(server)
    resp = client.request(method, "/metrics" if server == "dcgm_exporter" else "/healthz")
    assert resp.status_code == 405 and resp.headers["allow"] == "GET"
    if method != "HEAD":
        assert resp.text == f"method {method} not allowed: use GET\n"


# -- the visibility API's bugs the fuzz found, each with its failing request ---------------


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"])
def test_the_visibility_api_answers_other_methods_with_a_status(
    method: str, kueue_visibility: httpx.Client, kueue_visibility_anonymous: httpx.Client
) -> None:
    """http.server answered 501 (an HTML page) to any method but GET. And the body must be
    read: the next request on the kept-alive connection is answered as its own."""
    path = f"{VIS}/v1beta2/clusterqueues/cq/pendingworkloads"
    for client, code in ((kueue_visibility, 405), (kueue_visibility_anonymous, 401)):
        resp = client.request(method, path, content=b'{"limit": 1}' * 10)
        assert resp.status_code == code and resp.headers["content-type"] == "application/json"
        if method != "HEAD":
            assert resp.json()["code"] == code and resp.json()["message"]
    assert kueue_visibility.request(method, path).status_code == 405
    resp = kueue_visibility.get(path)
    assert resp.status_code == 200 and len(resp.json()["items"]) == len(PENDING)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("limit=1e9", 'strconv.ParseInt: parsing "1e9": invalid syntax'),
        ("limit=abc", 'strconv.ParseInt: parsing "abc": invalid syntax'),
        ("offset=", 'strconv.ParseInt: parsing "": invalid syntax'),
        ("limit=%205", 'strconv.ParseInt: parsing " 5": invalid syntax'),
        ("limit=5_0", 'strconv.ParseInt: parsing "5_0": invalid syntax'),
        ("offset=%00", 'strconv.ParseInt: parsing "\\x00": invalid syntax'),
        (
            "offset=9223372036854775808",
            'strconv.ParseInt: parsing "9223372036854775808": value out of range',
        ),
        ("limit=" + "1" * 5000, "value out of range"),
        ("limit=abc&limit=1", 'strconv.ParseInt: parsing "abc": invalid syntax'),
    ],
)
def test_the_visibility_api_refuses_a_bad_limit_or_offset_as_upstream(
    query: str, message: str, kueue_visibility: httpx.Client
) -> None:
    """Python's int() text ("invalid literal for int() with base 10") was the answer, a
    blank value was taken as the default, and " 5" or "5_0" were read as numbers; upstream's
    parameter codec (strconv.ParseInt) refuses them all with a 400 BadRequest."""
    resp = kueue_visibility.get(f"{VIS}/v1beta2/clusterqueues/cq/pendingworkloads?{query}")
    body = resp.json()
    assert (resp.status_code, body["reason"], body["code"]) == (400, "BadRequest", 400)
    assert message in body["message"]


@pytest.mark.parametrize(
    ("query", "names"),
    [
        ("limit=1&limit=abc", ["w-high"]),  # the first value counts, as in url.Values
        ("limit=-1", []),
        ("offset=-1&limit=2", ["w-high", "w-mid"]),
        ("limit=0", [n for n, *_ in PENDING]),  # SetDefaults: 0 is the default, 1,000
        (f"offset=3&limit={2**63 - 1}", ["w-new", "w-last"]),
    ],
)
def test_the_visibility_api_bounds_limit_and_offset(
    query: str, names: list[str], kueue_visibility: httpx.Client
) -> None:
    resp = kueue_visibility.get(f"{VIS}/v1beta2/clusterqueues/cq/pendingworkloads?{query}")
    assert [i["metadata"]["name"] for i in resp.json()["items"]] == names


def test_the_visibility_api_reads_names_decoded(kueue_visibility: httpx.Client) -> None:
    """Go routes on the decoded path: "c%71" is "cq"; a NUL is quoted as Go's %q does."""
    resp = kueue_visibility.get(f"{VIS}/v1beta1/clusterqueues/c%71/pendingworkloads")
    assert resp.status_code == 200 and len(resp.json()["items"]) == len(PENDING)
    resp = kueue_visibility.get(f"{VIS}/v1beta1/clusterqueues/%00/pendingworkloads")
    assert resp.status_code == 404
    assert resp.json()["message"] == f'clusterqueue.{kvis.GROUP} "\\x00" not found'
    resp = kueue_visibility.get(
        f"{VIS}/v1beta1/namespaces/%2E%2E/localqueues/lq-a/pendingworkloads"
    )
    assert resp.status_code == 403 and resp.json()["message"].endswith('in the namespace ".."')


def test_the_visibility_api_answers_without_a_delayed_ack(kueue_visibility: httpx.Client) -> None:
    """Each answer took 40 ms: headers and body in two writes, the second held by Nagle's
    algorithm until the client's delayed ACK. 50 answers now take well under a second."""
    path = f"{VIS}/v1beta2/namespaces/team/localqueues/lq-b/pendingworkloads"
    kueue_visibility.get(path)  # the connection is open
    start = time.monotonic()
    for _ in range(50):
        assert kueue_visibility.get(path).status_code == 200
    assert time.monotonic() - start < 1.0


def test_the_visibility_api_trusts_x_remote_headers_only_from_the_front_proxy(
    visibility_server: tuple[str, pki.KeyPair, pki.KeyPair], tmp_path: Path
) -> None:
    """A certificate of the front proxy's CA with a name not in requestheader-allowed-names
    is not the front proxy: its X-Remote-User counts for nothing (401, as without one)."""
    url, _, front = visibility_server
    stranger = pki.issue(front, tmp_path, "stranger", "stranger", client=True)
    path = f"{VIS}/v1beta2/clusterqueues/cq/pendingworkloads"
    for cert in (stranger, None):
        with aggregator(url, cert) as client:
            resp = client.get(path)
        assert resp.status_code == 401 and resp.json()["reason"] == "Unauthorized"
