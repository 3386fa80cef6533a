"""The Kueue webhook server over HTTPS with real AdmissionReview v1 / ConversionReview v1
bodies, and every path the webhook configurations in manifests/kueue name."""

from __future__ import annotations

import base64
import copy
import http.client
import json
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpulab.kueue import webhook
from harness import pki
from harness.apply import MANIFESTS, load_documents
from harness.ports import free_port

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kueue"


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


def apply_json_patch(obj: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """Enough of RFC 6902 (add/replace) to apply what the webhook returns."""
    out = copy.deepcopy(obj)
    for op in patch:
        assert op["op"] in ("add", "replace")
        *parents, last = op["path"].lstrip("/").split("/")
        target = out
        for p in parents:
            target = target[p]
        target[last] = op["value"]
    return out


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """An HTTPS client for the webhook server, started once for this module."""
    certs = tmp_path_factory.mktemp("certs")
    ca = pki.create_ca(certs)
    pair = pki.issue(ca, certs, "tls", "kueue-webhook", hosts=("127.0.0.1",))
    port = free_port()
    server = webhook.serve_in_thread(
        f"127.0.0.1:{port}", str(pair.cert), str(pair.key), webhook.Lookups(), threading.Event()
    )
    verify = ssl.create_default_context(cafile=str(ca.cert))
    try:
        with httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=verify, timeout=5) as c:
            yield c
    finally:
        server.should_exit = True


def test_job_with_queue_name_is_created_suspended(client: httpx.Client) -> None:
    review = fixture("admission-review-job.json")
    resp = client.post("/mutate-batch-v1-job", json=review)
    assert resp.status_code == 200
    body = resp.json()
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    out = body["response"]
    assert out["uid"] == review["request"]["uid"]
    assert out["allowed"] is True
    assert out["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(out["patch"]))
    job = apply_json_patch(review["request"]["object"], patch)
    assert job["spec"]["suspend"] is True
    # Nothing else in the Job changes.
    job["spec"]["suspend"] = False
    assert job == review["request"]["object"]


def test_job_without_queue_name_or_already_suspended_is_untouched(client: httpx.Client) -> None:
    review = fixture("admission-review-job.json")
    review["request"]["object"]["metadata"]["labels"] = {"app": "other"}
    out = client.post("/mutate-batch-v1-job", json=review).json()["response"]
    assert out["allowed"] is True and "patch" not in out
    review = fixture("admission-review-job.json")
    review["request"]["object"]["spec"]["suspend"] = True
    out = client.post("/mutate-batch-v1-job", json=review).json()["response"]
    assert "patch" not in out


def test_conversion_review(client: httpx.Client) -> None:
    review = fixture("conversion-review-clusterqueue.json")
    resp = client.post("/convert", json=review)
    assert resp.status_code == 200
    body = resp.json()
    assert body["kind"] == "ConversionReview" and body["apiVersion"] == "apiextensions.k8s.io/v1"
    out = body["response"]
    assert out["uid"] == review["request"]["uid"]
    assert out["result"] == {"status": "Success"}
    cq, lq = out["convertedObjects"]
    assert cq["apiVersion"] == lq["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert cq["spec"]["cohortName"] == "gpu-team" and "cohort" not in cq["spec"]
    assert cq["spec"]["flavorFungibility"]["whenCanBorrow"] == "MayStopSearch"
    # metadata (uid, resourceVersion) must come back unchanged, or the API server fails.
    assert cq["metadata"] == review["request"]["objects"][0]["metadata"]
    assert lq["status"]["flavorsUsage"][0]["resources"][0]["total"] == "2"


def test_conversion_failure_is_reported_in_result(client: httpx.Client) -> None:
    review = fixture("conversion-review-clusterqueue.json")
    review["request"]["desiredAPIVersion"] = "kueue.x-k8s.io/v1alpha1"
    out = client.post("/convert", json=review).json()["response"]
    assert out["result"]["status"] == "Failure"
    assert "v1alpha1" in out["result"]["message"]


def test_bad_bodies_and_health(client: httpx.Client) -> None:
    assert client.post("/convert", content=b"not json").status_code == 400
    assert client.post("/mutate-batch-v1-job", json=[1, 2]).status_code == 400
    assert client.get("/healthz").text == "ok"
    assert client.get("/readyz").status_code == 200


def test_every_webhook_the_manifests_register_is_served(client: httpx.Client) -> None:
    paths = {
        w["clientConfig"]["service"]["path"]
        for doc in load_documents([MANIFESTS / "kueue"])
        if doc["kind"].endswith("WebhookConfiguration")
        for w in doc["webhooks"]
    }
    assert len(paths) == 12
    review = fixture("admission-review-job.json")
    for path in paths:
        resp = client.post(path, json=review)
        assert resp.status_code == 200, path
        assert resp.json()["response"]["uid"] == review["request"]["uid"]
    crd_paths = {
        d["spec"]["conversion"]["webhook"]["clientConfig"]["service"]["path"]
        for d in load_documents([MANIFESTS / "kueue" / "crds"])
        if "conversion" in d["spec"]
    }
    assert crd_paths == {webhook.CONVERT_PATH}


def test_parse_bind() -> None:
    assert webhook.parse_bind("127.0.0.1:9443") == ("127.0.0.1", 9443)
    for bad in ("9443", "127.0.0.1:", ":9443", "host:port"):
        with pytest.raises(ValueError):
            webhook.parse_bind(bad)


def test_an_idle_keep_alive_connection_is_not_closed_under_the_api_server(
    client: httpx.Client,
) -> None:
    """kube-apiserver keeps webhook connections idle for up to 90 s and then reuses them;
    a server that closes them sooner (uvicorn's default is 5 s) races that reuse and the
    API server reads EOF ("failed calling webhook ... EOF": a 500 for the user)."""
    conn = http.client.HTTPSConnection(
        client.base_url.host,
        client.base_url.port,
        context=ssl._create_unverified_context(),  # the connection is the point, not the CA
        timeout=5,
    )
    body = json.dumps(fixture("admission-review-job.json"))
    headers = {"Content-Type": "application/json"}
    try:
        for pause in (0, 6.5):
            time.sleep(pause)
            conn.request("POST", "/mutate-batch-v1-job", body, headers)
            resp = conn.getresponse()
            assert resp.status == 200
            resp.read()
    finally:
        conn.close()


# -- bodies the fuzz (test_fuzz.py) found answered by an exception ----------------------------


def _cq(name: Any = "a100", quota: Any = 4) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": "cq"},
        "spec": {
            "resourceGroups": [
                {
                    "coveredResources": ["nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": name,
                            "resources": [{"name": "nvidia.com/gpu", "nominalQuota": quota}],
                        }
                    ],
                }
            ]
        },
    }


def _reviewed(path: str, obj: dict[str, Any]) -> dict[str, Any]:
    body = fixture("admission-review-job.json")
    body["request"]["object"] = obj
    return webhook.review(path, body, webhook.Lookups())["response"]


@pytest.mark.parametrize("labels", [True, -1, "x", [None]])
def test_labels_that_are_not_a_map_are_refused_by_name(labels: Any) -> None:
    job = fixture("admission-review-job.json")["request"]["object"]
    job["metadata"]["labels"] = labels
    out = _reviewed("/mutate-batch-v1-job", job)
    assert out["allowed"] is False and out["status"]["code"] == 400
    assert out["status"]["message"] == "request.object.metadata.labels must be a map of strings"


def test_a_flavor_name_that_is_not_a_string_is_a_field_error() -> None:
    out = _reviewed("/validate-kueue-x-k8s-io-v1beta2-clusterqueue", _cq(name=[]))
    assert out["allowed"] is False
    assert (
        "spec.resourceGroups[0].flavors[0].name: Invalid value: []: must be a string"
        in (out["status"]["message"])
    )


def test_a_pod_set_name_that_is_not_a_string_is_a_field_error() -> None:
    wl = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": "w", "namespace": "team"},
        "spec": {"queueName": "lq", "podSets": [{"name": {"metadata": {}}, "count": 1}]},
    }
    out = _reviewed("/validate-kueue-x-k8s-io-v1beta2-workload", wl)
    assert out["allowed"] is False
    assert (
        'spec.podSets[0].name: Invalid value: {"metadata":{}}: must be a string'
        in (out["status"]["message"])
    )


def test_a_nan_quantity_is_not_an_exception() -> None:
    out = _reviewed("/validate-kueue-x-k8s-io-v1beta2-clusterqueue", _cq(quota="NaN"))
    assert out["allowed"] is True  # not a quantity: the CRD schema refuses it before us
