"""vc-webhook-manager's HTTPS server with AdmissionReview v1 bodies as kube-apiserver sends
them, for upstream's own example vcjobs (manifests/volcano/samples), and 1,000 seeded
hostile bodies to each of its routes: never a 5xx, never a dropped connection, every
refusal inside an AdmissionReview (``allowed: false``, code 400) saying what was wrong."""

from __future__ import annotations

import base64
import io
import json
import random
import ssl
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gpulab.informer import Store
from gpulab.trace import Tracer
from gpulab.volcano import objects as vo
from gpulab.volcano.server import serve
from gpulab.volcano.webhooks.server import PATHS, Admission, routes
from harness import pki
from harness.ports import free_port

SAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "volcano" / "samples"


def sample(name: str) -> dict[str, Any]:
    return yaml.safe_load((SAMPLES / name).read_text())


def review(obj: dict[str, Any], operation: str = "CREATE", resource: str = "jobs") -> dict:
    """An AdmissionReview as kube-apiserver v1.36 posts it."""
    group, version = obj["apiVersion"].split("/")
    gvr = {"group": group, "version": version, "resource": resource}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": group, "version": version, "kind": obj["kind"]},
            "resource": gvr,
            "requestKind": {"group": group, "version": version, "kind": obj["kind"]},
            "requestResource": gvr,
            "name": obj["metadata"].get("name", ""),
            "namespace": "default" if resource == "jobs" else "",
            "operation": operation,
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
            "object": obj if operation != "DELETE" else None,
            "oldObject": obj if operation == "DELETE" else None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    certs = tmp_path_factory.mktemp("certs")
    ca = pki.create_ca(certs)
    pair = pki.issue(ca, certs, "tls", "volcano-admission-service", hosts=("127.0.0.1",))
    queues = Store()
    queues.replace([vo.queue("default"), vo.queue("test", state="Closed")])
    ready = threading.Event()
    admission = Admission(queues, Tracer("vc-webhook-manager", stream=io.StringIO()), "volcano")
    port = free_port()
    server = serve(
        f"127.0.0.1:{port}",
        "--port",
        routes(admission, list(PATHS), ready),
        str(pair.cert),
        str(pair.key),
    )
    verify = ssl.create_default_context(cafile=str(ca.cert))
    try:
        with httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=verify, timeout=5) as c:
            yield c
    finally:
        server.should_exit = True


def post(client: httpx.Client, path: str, body: dict) -> dict:
    resp = client.post(path, json=body)
    assert resp.status_code == 200
    out = resp.json()
    assert out["kind"] == "AdmissionReview" and out["response"]["uid"] == body["request"]["uid"]
    return out["response"]


def test_upstreams_example_job_is_admitted(client: httpx.Client) -> None:
    job = sample("job.yaml")
    assert post(client, "/jobs/validate", review(job))["allowed"] is True
    out = post(client, "/jobs/mutate", review(job))
    patch = json.loads(base64.b64decode(out["patch"]))
    tasks = next(p["value"] for p in patch if p["path"] == "/spec/tasks")
    assert tasks[0]["minAvailable"] == 6 and tasks[0]["maxRetry"] == 3
    assert not any(p["path"] in ("/spec/queue", "/spec/minAvailable") for p in patch)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "invalid-minAvailable-webhook-deny.yaml",
            "job 'minAvailable' should not be greater than total replicas in tasks;",
        ),
        ("invalid-duplicatedTaskName-webhook-deny.yaml", "duplicated task name task-1;"),
        (
            "invalid-duplicatedPolicyEvent-webhook-deny.yaml",
            "1 error occurred:\n\t* duplicate event PodFailed  across different policy",
        ),
    ],
)
def test_upstreams_invalid_examples_are_denied_with_its_message(
    client: httpx.Client, name: str, message: str
) -> None:
    out = post(client, "/jobs/validate", review(sample(name)))
    assert out["allowed"] is False
    assert message in out["status"]["message"]


def test_a_job_for_a_closed_queue_is_denied(client: httpx.Client) -> None:
    job = vo.vcjob("j", [vo.task("w", 1)], queue="test", min_available=1)
    out = post(client, "/jobs/validate", review(job))
    assert out["allowed"] is False
    assert out["status"]["message"] == (
        "can only submit job to queue with state `Open`, queue `test` status is `Closed`;"
    )


def test_queues_get_defaults_and_default_cannot_go(client: httpx.Client) -> None:
    q = sample("queue.yaml")
    q["spec"].pop("weight")
    out = post(client, "/queues/mutate", review(q, resource="queues"))
    patch = json.loads(base64.b64decode(out["patch"]))
    assert patch == [{"op": "add", "path": "/spec/weight", "value": 1}]
    out = post(client, "/queues/validate", review(vo.queue("default"), "DELETE", "queues"))
    assert (
        out["allowed"] is False and out["status"]["message"] == "`default` queue can not be deleted"
    )


def test_health_and_a_request_that_is_not_a_review(client: httpx.Client) -> None:
    assert client.get("/healthz").status_code == 503  # the queue informer has not synced
    out = client.post("/jobs/validate", content=b"{}")
    assert out.status_code == 200
    response = out.json()["response"]
    assert response["allowed"] is False and response["status"]["code"] == 400
    assert response["status"]["message"] == "the AdmissionReview carries no request"


def test_a_pod_group_for_a_closed_queue_is_denied(client: httpx.Client) -> None:
    closed = vo.podgroup("pg", "default", queue="test")
    out = post(client, "/podgroups/validate", review(closed, resource="podgroups"))
    assert out["allowed"] is False
    assert out["status"]["message"] == (
        "can only submit PodGroup to queue with state `Open`, queue `test` status is `Closed`."
    )
    fine = vo.podgroup("pg", "default", queue="default")
    assert post(client, "/podgroups/validate", review(fine, resource="podgroups"))["allowed"]


def test_a_queue_deserving_more_than_its_capability_is_denied(client: httpx.Client) -> None:
    q = vo.queue("q", capability={"nvidia.com/gpu": 4})
    q["spec"]["deserved"] = {"nvidia.com/gpu": "8"}
    out = post(client, "/queues/validate", review(q, resource="queues"))
    assert out["allowed"] is False
    assert out["status"]["message"] == (
        'requestBody.spec.deserved.nvidia.com/gpu: Invalid value: "8": '
        "deserved[nvidia.com/gpu]=8 must be <= capability[nvidia.com/gpu]=4"
    )


# -- hostile bodies -------------------------------------------------------------------------

ROUNDS = 1000  # per route
JUNK: list[Any] = [
    None,
    True,
    0,
    -1,
    2**70,
    1.5,
    "",
    "abc",
    [],
    {},
    [None],
    {"": None},
    "\u0000",
    "💥" * 50,
    {"nested": {"deeper": [1, {"x": None}]}},
    "-5",
    "1e400",
]
ROUTE_OBJECTS: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {
    "/jobs/mutate": ("jobs", lambda: sample("job.yaml")),
    "/jobs/validate": ("jobs", lambda: sample("job.yaml")),
    "/podgroups/validate": ("podgroups", lambda: vo.podgroup("pg", "default")),
    "/queues/mutate": ("queues", lambda: sample("queue.yaml")),
    "/queues/validate": ("queues", lambda: sample("queue.yaml")),
}
# hostile shapes that must be refused, and a word each refusal must carry
WRONG_TYPES = {
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


def mutate(rng: random.Random, obj: Any, depth: int = 0) -> Any:
    """Replace, drop or retype one random part of ``obj``."""
    if isinstance(obj, dict) and obj and depth < 8 and rng.random() < 0.8:
        key = rng.choice(list(obj))
        out = dict(obj)
        roll = rng.random()
        if roll < 0.2:
            del out[key]
        elif roll < 0.4:
            out[key] = rng.choice(JUNK)
        else:
            out[key] = mutate(rng, obj[key], depth + 1)
        return out
    if isinstance(obj, list) and obj and depth < 8 and rng.random() < 0.8:
        out = list(obj)
        i = rng.randrange(len(out))
        out[i] = mutate(rng, out[i], depth + 1)
        return out
    return rng.choice(JUNK)


def hostile(rng: random.Random, route: str) -> tuple[bytes, str | None]:
    """One hostile body for ``route`` and, where the refusal must name the problem, the
    text it must contain."""
    resource, make = ROUTE_OBJECTS[route]
    body = review(make(), rng.choice(["CREATE", "UPDATE"]), resource)
    request = body["request"]
    roll = rng.random()
    if roll < 0.06:
        return bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 300))), None
    if roll < 0.1:
        depth = rng.choice([2_000, 100_000])
        return b'{"request": ' + b"[" * depth + b"]" * depth + b"}", "nests deeper"
    if roll < 0.13:
        return b'{"request": {"uid": "u", "object": ' + b'{"a":' * 900 + b"1" + b"}" * 901, None
    if roll < 0.16:
        return rng.choice([b"", b"null", b"[]", b'"review"', b"NaN", b"\xff\xfe{}"]), None
    if roll < 0.3:
        request["operation"] = rng.choice(["DELETE", "CONNECT", "create", "", "PATCH"])
        if route == "/queues/validate" and request["operation"] == "DELETE":
            request["operation"] = "CONNECT"
        return json.dumps(body).encode(), "operation"
    if roll < 0.4:
        other = rng.choice([r for r in ("jobs", "podgroups", "queues") if r != resource])
        request["resource"]["resource"] = other
        return json.dumps(body).encode(), "expect resource to be"
    if roll < 0.48:
        request["object"]["kind"] = rng.choice(["Pod", "Deployment", "Queue", "Job"])
        request["object"]["apiVersion"] = rng.choice(["v1", "apps/v1", "batch/v1"])
        return json.dumps(body).encode(), "expected"
    if roll < 0.7:
        (where, value, word) = rng.choice(WRONG_TYPES[resource])
        target = request["object"]
        for key in where[:-1]:
            target = target.setdefault(key, {})
        target[where[-1]] = value
        return json.dumps(body).encode(), word
    return json.dumps(mutate(rng, body)).encode(), None


def well_formed(resp: httpx.Response) -> dict[str, Any] | None:
    if resp.status_code != 200:
        return None
    out = resp.json()
    response = out.get("response") if isinstance(out, dict) else None
    if out.get("kind") != "AdmissionReview" or not isinstance(response, dict):
        return None
    if not isinstance(response.get("allowed"), bool) or not isinstance(response.get("uid"), str):
        return None
    return response


def test_hostile_bodies_get_a_refusal_that_says_why_never_a_5xx(client: httpx.Client) -> None:
    rng = random.Random(20260729)
    failures: list[str] = []
    counts: Counter[str] = Counter()
    slowest = 0.0
    for route in ROUTE_OBJECTS:
        for _ in range(ROUNDS):
            raw, word = hostile(rng, route)
            start = time.monotonic()
            try:
                resp = client.post(route, content=raw, headers={"Content-Type": "application/json"})
            except httpx.HTTPError as exc:
                counts["dropped"] += 1
                failures.append(f"{route}: {type(exc).__name__}: {exc}")
                continue
            slowest = max(slowest, time.monotonic() - start)
            if resp.status_code >= 500:
                counts["5xx"] += 1
                failures.append(f"{route}: HTTP {resp.status_code} for {raw[:120]!r}")
                continue
            response = well_formed(resp)
            if response is None:
                failures.append(f"{route}: not an AdmissionReview: {resp.text[:200]}")
                continue
            if response["allowed"]:
                counts[f"{route} allowed"] += 1
                if word is not None:
                    failures.append(f"{route}: admitted {raw[:200]!r}")
                continue
            counts[f"{route} refused"] += 1
            message = (response.get("status") or {}).get("message") or ""
            if not message:
                failures.append(f"{route}: a refusal without a message for {raw[:120]!r}")
            elif word is not None:
                counts["named"] += 1
                if word not in message or response["status"].get("code") != 400:
                    failures.append(f"{route}: {message!r} does not say {word!r}")
    assert counts["5xx"] == 0 and counts["dropped"] == 0, failures[:5]
    assert not failures, failures[:10]
    for route in ROUTE_OBJECTS:  # both the accept and the reject path ran
        assert counts[f"{route} allowed"] > 0 and counts[f"{route} refused"] > 0, counts
    assert counts["named"] > 2000, counts
    assert slowest < 2.0, slowest
    # too large for the server: 413, as upstream's MaxBytesReader, and it still serves
    big = b'{"request": {"uid": "' + b"x" * (3 * 1024 * 1024) + b'"}}'
    assert client.post("/jobs/validate", content=big).status_code == 413
    assert post(client, "/jobs/validate", review(sample("job.yaml")))["allowed"] is True
