"""vc-webhook-manager's HTTPS server with AdmissionReview v1 bodies as kube-apiserver sends
them, for upstream's own example vcjobs (manifests/volcano/samples), and 1,000 seeded
hostile bodies to each of its routes: never a 5xx, never a dropped connection, every
refusal inside an AdmissionReview (``allowed: false``, code 400) saying what was wrong."""

from __future__ import annotations

import base64
import io
import json
import ssl
import threading
import uuid
from collections.abc import Iterator
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


def test_a_capability_beyond_int64_is_answered_not_a_500(client: httpx.Client) -> None:
    """Found by test_fuzz.py: 1e400 cpu overflowed a float, HTTP 500, connection dropped."""
    q = vo.queue("big", capability={"cpu": "1e400"})
    assert post(client, "/queues/validate", review(q, resource="queues"))["allowed"] is True


def test_a_null_uid_is_answered_with_an_empty_one(client: httpx.Client) -> None:
    """Found by test_fuzz.py: the answer carried ``"uid": null``, outside the protocol."""
    body = review(sample("queue.yaml"), resource="queues")
    body["request"]["uid"] = None
    out = client.post("/queues/mutate", json=body).json()["response"]
    assert out["uid"] == "" and isinstance(out["allowed"], bool)


# Hostile bodies for every route: tests/component/test_fuzz.py (the shared harness).
