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
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
from gpulab.kueue import webhook as kwebhook
from gpulab.kueue.metrics import Metrics as KueueMetrics
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
    # a GET endpoint that answers any query (metrics, probes) refuses only what it must
    report.check(both_paths=endpoint.method == "POST" and endpoint.path != "/bind")
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
