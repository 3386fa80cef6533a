"""1,200 malformed and hostile bodies to /filter, /bind and /webhook.

As HAMi v2.10.0 (and controller-runtime for /webhook) does, every answer is HTTP 200 with a
well-formed protocol answer — the error, if any, in its ``Error`` field or the
AdmissionReview's status — never a 4xx/5xx, never a hang; memory stays bounded, and the
extender must still schedule afterwards.
"""

from __future__ import annotations

import copy
import json
import random
import tracemalloc
from collections.abc import Callable
from typing import Any

from test_hami_extender import World, filter_args, fixture, serve  # noqa: F401

from gpulab.hami import annotations as ann

ROUNDS = 400  # x 3 routes

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


def raw_bodies(rng: random.Random) -> list[Callable[[], bytes]]:
    return [
        lambda: bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 200))),
        lambda: b"[" * 100_000 + b"]" * 100_000,  # nesting beyond the recursion limit
        lambda: (b'{"a":' * 500) + b"1" + (b"}" * 500),  # deep but legal
        lambda: b'{"Pod": {"metadata": {"name": "x"}, "spec": ' + b"{" * 5000,
        lambda: b'{"Pod": ' + json.dumps("x" * 10).encode() + b"}",
        lambda: b"\xff\xfe\x00{}",
        lambda: b"",
    ]


def hostile_filter(rng: random.Random, pod: dict[str, Any]) -> Any:
    args = filter_args(copy.deepcopy(pod))
    choice = rng.random()
    if choice < 0.15:
        args["NodeNames"] = [f"ghost-{rng.randrange(1000)}" for _ in range(rng.randrange(5))]
    elif choice < 0.3:
        ctr = args["Pod"]["spec"]["containers"][0]
        ctr["resources"]["limits"]["nvidia.com/gpu"] = rng.choice(["abc", "-3", "1.5", 7, "99"])
    elif choice < 0.4:
        args["Pod"]["metadata"]["annotations"] = {
            "nvidia.com/use-gpuuuid": rng.choice(["", ",,,", "GPU-gpu-node-1-00", None, 7]),
            "hami.io/node-scheduler-policy": rng.choice(["binpack", "x" * 300, "", ["spread"]]),
        }
    elif choice < 0.5:
        meta = args["Pod"]["metadata"]
        meta[rng.choice(["name", "namespace", "uid", "annotations"])] = rng.choice(JUNK)
    return mutate(rng, args) if rng.random() < 0.7 else args


def hostile_bind(rng: random.Random) -> Any:
    args = {
        "PodName": rng.choice(["vgpu-a", "nope", ""]),
        "PodNamespace": "default",
        "PodUID": "u",
        "Node": rng.choice(["gpu-node-1", "ghost", ""]),
    }
    return mutate(rng, args) if rng.random() < 0.7 else args


def well_formed(route: str, status: int, body: Any) -> bool:
    if status != 200 or not isinstance(body, dict):
        return False
    if route == "/filter":
        return set(body) == {
            "Nodes",
            "NodeNames",
            "FailedNodes",
            "FailedAndUnresolvableNodes",
            "Error",
        } and isinstance(body["Error"], str)
    if route == "/bind":
        return set(body) == {"Error"} and isinstance(body["Error"], str)
    response = body.get("response")
    return isinstance(response, dict) and isinstance(response.get("allowed"), bool)


def refused(route: str, body: dict[str, Any]) -> bool:
    if route == "/webhook":
        return body["response"]["status"]["code"] == 400
    return bool(body["Error"])


def test_hostile_bodies_never_crash_the_extender(serve: Any) -> None:  # noqa: F811
    rng = random.Random(20261129)
    world = World()
    pod = world.add_vgpu_pod("vgpu-a", mem=1000, cores=1)
    review = fixture("admission_review_gpu.json")
    raws = raw_bodies(rng)
    outcomes = {"refused": 0, "answered": 0}
    tracemalloc.start()
    with serve(world.app) as http:
        for i in range(ROUNDS):
            if i == ROUNDS // 4:  # warmed up: caches, pools and lazy imports are in place
                baseline = tracemalloc.get_traced_memory()[0]
            for route in ("/filter", "/bind", "/webhook"):
                if i % 5 == 0:
                    content = rng.choice(raws)()
                elif route == "/filter":
                    content = json.dumps(hostile_filter(rng, pod)).encode()
                elif route == "/bind":
                    content = json.dumps(hostile_bind(rng)).encode()
                else:
                    content = json.dumps(mutate(rng, review)).encode()
                resp = http.post(route, content=content)
                try:
                    body = resp.json()
                except ValueError:
                    body = None
                assert well_formed(route, resp.status_code, body), (
                    route,
                    content[:300],
                    resp.text[:300],
                )
                outcomes["refused" if refused(route, body) else "answered"] += 1
        grown = tracemalloc.get_traced_memory()[0] - baseline
        tracemalloc.stop()
        # 900 more hostile requests (hundreds of KB each at times) leave nothing behind
        assert grown < 4 << 20, f"memory grew by {grown / 2**20:.1f} MiB"
        for _ in range(3):  # bodies over the 1 MB limit: cut, so they do not decode
            resp = http.post("/filter", content=b'{"Pod": "' + b"a" * (1 << 20) + b'"}')
            assert resp.status_code == 200 and "unexpected EOF" in resp.json()["Error"]
        assert http.get("/healthz").status_code == 200
        # Still schedules: a clean pod after the storm gets a node.
        world.cluster.pods.pop(("default", "vgpu-a"))
        clean = world.add_vgpu_pod("after", mem=1000, cores=1)
        result = http.post("/filter", json=filter_args(clean)).json()
        assert result["NodeNames"] and ann.ASSIGNED_NODE in world.annotations("after")
    assert sum(outcomes.values()) >= 1200
    assert outcomes["refused"] > 100 and outcomes["answered"] > 100  # both paths exercised
