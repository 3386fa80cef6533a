"""Hostile bodies to every Kueue webhook path over HTTPS: 1,000 per path (random bytes,
truncated and deeply nested JSON, wrong types inside valid AdmissionReviews and
ConversionReviews, bodies over the size limit).

Every answer must be 400 or 413 with a message, or a well-formed protocol answer: never
a 5xx, never a dropped connection; a review that parses is answered in the protocol
(``allowed: false`` with a status, ``result.status: Failure`` with a message). Both the
accept and the reject paths must have run, and the server must still work afterwards.

A refusal must come from a check, not from an exception: the webhook turns any
exception into a 400 ("could not answer: ...") and an exception inside a review into
"malformed object: <type>: ..."; a conversion answer starting "malformed " is counted
the same way (exception text, not a field check). Such answers must not occur, so a
validator or converter bug cannot pass for a refusal.
"""

from __future__ import annotations

import copy
import json
import random
import ssl
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpulab.kueue import api, webhook
from harness import pki
from harness.ports import free_port

ROUNDS = 1000  # per path
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kueue"
JUNK: list[Any] = [
    None,
    True,
    0,
    -1,
    2**70,
    1.5,
    "",
    "x",
    [],
    {},
    [None],
    {"": None},
    "\u0000",
    "💥" * 50,
    {"nested": {"deeper": [1, {"x": None}]}},
    ["nvidia.com/gpu"],
    "-5",
    "1e400",
    "NaN",
]


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


def review_of(obj: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    body = fixture("admission-review-job.json")
    body["request"]["object"] = obj
    body["request"]["operation"] = operation
    if operation == "UPDATE":
        body["request"]["oldObject"] = copy.deepcopy(obj)
    return body


GPU_SPEC = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
QUEUED = {api.QUEUE_LABEL: "lq"}


def seeds() -> dict[str, dict[str, Any]]:
    cq = {
        "apiVersion": api.API_VERSION,
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
        "apiVersion": api.API_VERSION,
        "kind": "Workload",
        "metadata": {"name": "w", "namespace": "team"},
        "spec": {
            "queueName": "lq",
            "podSets": [{"name": "main", "count": 1, "template": {"spec": GPU_SPEC}}],
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": QUEUED},
        "spec": GPU_SPEC,
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "labels": QUEUED},
        "spec": {"replicas": 2, "template": {"metadata": {"labels": {"a": "b"}}, "spec": GPU_SPEC}},
    }
    return {
        "/mutate-batch-v1-job": fixture("admission-review-job.json"),
        "/validate-batch-v1-job": review_of(
            fixture("admission-review-job.json")["request"]["object"], "UPDATE"
        ),
        "/mutate--v1-pod": review_of(pod),
        "/validate--v1-pod": review_of(pod, "UPDATE"),
        "/mutate-apps-v1-deployment": review_of(deployment),
        "/validate-apps-v1-deployment": review_of(deployment, "UPDATE"),
        "/mutate-apps-v1-statefulset": review_of({**deployment, "kind": "StatefulSet"}),
        "/validate-apps-v1-statefulset": review_of({**deployment, "kind": "StatefulSet"}),
        "/validate-kueue-x-k8s-io-v1beta2-clusterqueue": review_of(cq, "UPDATE"),
        "/validate-kueue-x-k8s-io-v1beta2-cohort": review_of({**cq, "kind": "Cohort"}),
        "/validate-kueue-x-k8s-io-v1beta2-resourceflavor": review_of(
            {"metadata": {"name": "f"}, "spec": {"nodeLabels": {"a": "b"}, "nodeTaints": []}}
        ),
        "/validate-kueue-x-k8s-io-v1beta2-workload": review_of(workload, "UPDATE"),
        webhook.CONVERT_PATH: fixture("conversion-review-clusterqueue.json"),
    }


def mutate(rng: random.Random, obj: Any, depth: int = 0) -> Any:
    """Replace, drop or retype one random part of ``obj``."""
    if isinstance(obj, dict) and obj and depth < 10 and rng.random() < 0.85:
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
    if isinstance(obj, list) and obj and depth < 10 and rng.random() < 0.85:
        out = list(obj)
        i = rng.randrange(len(out))
        out[i] = mutate(rng, out[i], depth + 1)
        return out
    return rng.choice(JUNK)


def raw_bodies(rng: random.Random, seed: dict[str, Any]) -> list[Callable[[], bytes]]:
    text = json.dumps(seed).encode()
    return [
        lambda: bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 200))),
        lambda: b"[" * 100_000 + b"]" * 100_000,  # nesting beyond the recursion limit
        lambda: (b'{"a":' * 900) + b"1" + (b"}" * 900),  # deep but legal
        lambda: text[: rng.randrange(1, len(text))],  # truncated
        lambda: b'{"request": ' + b'{"x": ' * 3000 + b"1" + b"}" * 3000 + b"}",
        lambda: b"\xff\xfe\x00{}",
        lambda: b"",
        lambda: b"[1, 2, 3]",
    ]


OVERSIZED = b'{"request": "' + b"x" * (webhook.MAX_BODY + 1) + b'"}'


def in_protocol(path: str, body: Any) -> bool:
    response = body.get("response") if isinstance(body, dict) else None
    if not isinstance(response, dict) or not isinstance(response.get("uid"), str):
        return False
    if path == webhook.CONVERT_PATH:
        result = response.get("result") or {}
        if result.get("status") == "Failure":
            return isinstance(result.get("message"), str) and bool(result["message"])
        return result.get("status") == "Success" and isinstance(
            response.get("convertedObjects"), list
        )
    if not isinstance(response.get("allowed"), bool):
        return False
    if not response["allowed"]:
        status = response.get("status") or {}
        return status.get("code") in (400, 403) and bool(status.get("message"))
    return True


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    certs = tmp_path_factory.mktemp("certs")
    ca = pki.create_ca(certs)
    pair = pki.issue(ca, certs, "tls", "kueue-webhook", hosts=("127.0.0.1",))
    port = free_port()
    stop = threading.Event()
    server = webhook.serve_in_thread(
        f"127.0.0.1:{port}", str(pair.cert), str(pair.key), webhook.Lookups(), stop
    )
    verify = ssl.create_default_context(cafile=str(ca.cert))
    try:
        with httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=verify, timeout=30) as c:
            yield c
    finally:
        server.should_exit = True


@pytest.mark.parametrize("path", list(seeds()))
def test_hostile_bodies_never_crash_a_webhook(client: httpx.Client, path: str) -> None:
    rng = random.Random(f"kueue-fuzz-{path}")
    seed = seeds()[path]
    raws = raw_bodies(rng, seed)
    statuses: Counter[int] = Counter()
    outcomes: Counter[str] = Counter()
    bugs: list[str] = []  # answers an exception wrote
    dropped = 0
    for i in range(ROUNDS):
        if i % 200 == 7:
            content = OVERSIZED
        elif i % 5 == 0:
            content = rng.choice(raws)()
        else:
            content = json.dumps(mutate(rng, seed)).encode()
        try:
            resp = client.post(path, content=content, headers={"Content-Type": "application/json"})
        except httpx.TransportError:
            dropped += 1
            continue
        statuses[resp.status_code] += 1
        assert resp.status_code in (200, 400, 413), (resp.status_code, resp.text[:300])
        body = resp.json()
        if resp.status_code == 413:
            assert content is OVERSIZED
        elif resp.status_code == 400:
            assert isinstance(body.get("error"), str) and body["error"]
            if body["error"].startswith("could not answer"):
                bugs.append(body["error"])
        else:
            assert in_protocol(path, body), json.dumps(body)[:500]
            response = body["response"]
            ok = (
                response.get("allowed") is True
                or (response.get("result") or {}).get("status") == "Success"
            )
            outcomes["accepted" if ok else "refused"] += 1
            message = str(
                (response.get("status") or {}).get("message")
                or (response.get("result") or {}).get("message")
                or ""
            )
            if message.startswith("malformed object:") or "KeyError" in message:
                bugs.append(message)
            if path == webhook.CONVERT_PATH and message.startswith("malformed "):
                bugs.append(message)  # conversion's old catch-all wrote "malformed <Kind>: ..."
    assert not bugs, f"{len(bugs)} answers from an exception, e.g. {bugs[:3]}"
    assert dropped == 0
    assert statuses[413] == ROUNDS // 200
    assert outcomes["accepted"] > 0 and outcomes["refused"] + statuses[400] > 0
    # still serving the well-formed request afterwards
    resp = client.post(path, json=seed)
    assert resp.status_code == 200 and in_protocol(path, resp.json())
