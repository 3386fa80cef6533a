"""Pure fit/score/policy decisions of the HAMi extender (gpulab.hami.score, .device)."""

from __future__ import annotations

import pytest

from gpulab.hami import score
from gpulab.hami.device import (
    ContainerRequest,
    Defaults,
    RequestError,
    container_request,
    parse_quantity,
)
from gpulab.hami.score import DeviceUsage, NodeResult


def card(i: int, usedmem: int = 0, used: int = 0, usedcores: int = 0, **kw: object) -> DeviceUsage:
    args: dict = {
        "id": f"GPU-{i}",
        "index": i,
        "type": "NVIDIA A100-SXM4-40GB",
        "count": 10,
        "totalmem": 40960,
        "totalcore": 100,
        "used": used,
        "usedmem": usedmem,
        "usedcores": usedcores,
    }
    args.update(kw)
    return DeviceUsage(**args)


def req(nums: int = 1, mem: int = 10000, cores: int = 0, pct: int = 101) -> ContainerRequest:
    return ContainerRequest(nums=nums, memreq=mem, mem_percentage=pct, coresreq=cores)


def grants(result: NodeResult) -> list[list[str]]:
    return [[g.uuid for g in ctr] for ctr in result.devices]


def test_gpu_binpack_and_spread_choose_different_cards() -> None:
    cards = [card(0, usedmem=20000, used=1), card(1)]
    binpack = score.fit_pod("n", cards, [req()], {}, score.BINPACK)
    spread = score.fit_pod("n", cards, [req()], {}, score.SPREAD)
    assert grants(binpack) == [["GPU-0"]]  # the fuller card
    assert grants(spread) == [["GPU-1"]]  # the idle card


def test_fit_pod_leaves_the_callers_usage_untouched() -> None:
    cards = [card(0)]
    score.fit_pod("n", cards, [req()], {}, score.SPREAD)
    assert cards[0].usedmem == 0 and cards[0].used == 0


def test_node_binpack_and_spread_choose_different_nodes() -> None:
    busy = score.fit_pod(
        "busy", [card(0, usedmem=30000, used=2, usedcores=50)], [req()], {}, "spread"
    )
    idle = score.fit_pod("idle", [card(0)], [req()], {}, "spread")
    assert busy.score is not None and idle.score is not None and busy.score > idle.score
    assert score.pick_node([busy, idle], score.BINPACK).node == "busy"
    assert score.pick_node([busy, idle], score.SPREAD).node == "idle"


def test_pick_node_is_deterministic_on_ties_and_none_without_fit() -> None:
    a, b = NodeResult("b", True, score=0.0), NodeResult("a", True, score=0.0)
    assert score.pick_node([a, b], score.BINPACK).node == "a"
    assert score.pick_node([NodeResult("x", False, reason="r")], score.BINPACK) is None


def test_pod_that_cannot_fit_says_why() -> None:
    cards = [card(0, usedmem=35000), card(1, usedmem=36000)]
    result = score.fit_pod("n", cards, [req(mem=10000)], {}, score.SPREAD)
    assert not result.fit
    assert result.reason == "2/2 CardInsufficientMemory"
    too_many = score.fit_pod("n", cards, [req(nums=3)], {}, score.SPREAD)
    assert too_many.reason == score.NODE_INSUFFICIENT_DEVICE


@pytest.mark.parametrize(
    ("cardkw", "request_", "reason"),
    [
        ({"health": False}, req(), score.CARD_NOT_HEALTH),
        ({"count": 1, "used": 1}, req(), score.CARD_TIME_SLICING_EXHAUSTED),
        ({"usedcores": 80}, req(cores=30), score.CARD_INSUFFICIENT_CORE),
        ({"used": 1, "usedcores": 10}, req(cores=100), score.CARD_INSUFFICIENT_CORE),
        ({"used": 1}, req(cores=100), score.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT),
        ({"used": 2, "usedcores": 100}, req(cores=0), score.CARD_COMPUTE_UNITS_EXHAUSTED),
    ],
)
def test_card_checks(cardkw: dict, request_: ContainerRequest, reason: str) -> None:
    c = card(0)
    for k, v in cardkw.items():
        setattr(c, k, v)
    assert score.card_reason(c, request_, {}) == reason


def test_type_and_uuid_selection_annotations() -> None:
    cards = [card(0), card(1, type="NVIDIA H100 80GB HBM3")]
    only_h100 = score.fit_pod("n", cards, [req()], {"nvidia.com/use-gputype": "h100"}, "spread")
    assert grants(only_h100) == [["GPU-1"]]
    no_h100 = score.fit_pod("n", cards, [req()], {"nvidia.com/nouse-gputype": "H100"}, "binpack")
    assert grants(no_h100) == [["GPU-0"]]
    by_uuid = score.fit_pod("n", cards, [req()], {"nvidia.com/use-gpuuuid": "GPU-1"}, "binpack")
    assert grants(by_uuid) == [["GPU-1"]]
    none = score.fit_pod("n", cards, [req()], {"nvidia.com/use-gpuuuid": "GPU-9"}, "binpack")
    assert not none.fit and "CardUUIDMismatch" in none.reason
    avoid = score.fit_pod("n", cards, [req()], {"nvidia.com/nouse-gpuuuid": "GPU-0"}, "spread")
    assert grants(avoid) == [["GPU-1"]]


def test_multi_gpu_container_and_usage_between_containers() -> None:
    cards = [card(0), card(1)]
    two = score.fit_pod("n", cards, [req(nums=2, mem=1000)], {}, score.SPREAD)
    assert sorted(grants(two)[0]) == ["GPU-0", "GPU-1"]
    # Two containers of 30000 MiB cannot share one 40960 MiB card: the second moves over.
    pair = score.fit_pod("n", cards, [req(mem=30000), req(mem=30000)], {}, score.BINPACK)
    assert pair.fit and grants(pair)[0] != grants(pair)[1]
    trio = score.fit_pod("n", cards, [req(mem=30000)] * 3, {}, score.BINPACK)
    assert not trio.fit


def test_memory_percentage_is_taken_from_each_cards_size() -> None:
    result = score.fit_pod("n", [card(0)], [req(mem=0, pct=50)], {}, score.SPREAD)
    assert result.devices[0][0].usedmem == 20480


def test_containers_without_gpus_get_an_empty_entry() -> None:
    result = score.fit_pod("n", [card(0)], [ContainerRequest(0), req()], {}, score.SPREAD)
    assert grants(result) == [[], ["GPU-0"]]


def test_policy_overrides_and_invalid_values() -> None:
    annos = {score.NODE_POLICY_ANNOTATION: "spread", score.GPU_POLICY_ANNOTATION: "topology"}
    assert score.resolve_policy(annos, score.NODE_POLICY_ANNOTATION, "binpack") == "spread"
    assert score.resolve_policy(annos, score.GPU_POLICY_ANNOTATION, "spread") == "spread"
    assert score.resolve_policy({}, score.GPU_POLICY_ANNOTATION, "binpack") == "binpack"


def test_extender_score_follows_the_node_policy() -> None:
    full = NodeResult("a", True, score=24.0)
    empty = NodeResult("b", True, score=0.0)
    assert score.extender_score(full, "binpack") > score.extender_score(empty, "binpack")
    assert score.extender_score(full, "spread") < score.extender_score(empty, "spread")
    assert score.extender_score(NodeResult("c", False), "binpack") == 0


def test_quantities() -> None:
    assert parse_quantity("3000") == 3000
    assert parse_quantity("1k") == 1000
    assert parse_quantity("1Gi") == 2**30
    for bad in ("1.5", "abc", "", "1Xi", True, None, [1]):
        with pytest.raises(RequestError):
            parse_quantity(bad)


def test_container_request_defaults_like_hami() -> None:
    limits = {"resources": {"limits": {"nvidia.com/gpu": "2"}}}
    whole_card = container_request(limits, Defaults())
    assert (whole_card.nums, whole_card.memreq, whole_card.mem_percentage) == (2, 0, 100)
    defaulted = container_request(limits, Defaults(mem=3000, cores=20))
    assert (defaulted.memreq, defaulted.coresreq) == (3000, 20)
    requests_only = {
        "resources": {"requests": {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "250"}}
    }
    assert container_request(requests_only, Defaults()).coresreq == 100  # clamped
    assert container_request({"resources": {}}, Defaults()).nums == 0
    with pytest.raises(RequestError):
        container_request({"resources": {"limits": ["nvidia.com/gpu"]}}, Defaults())
