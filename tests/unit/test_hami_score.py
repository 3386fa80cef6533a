"""Fit, score and policy decisions of the extender (gpulab.hami.score, .device, .pods),
against HAMi v2.10.0's rules."""

from __future__ import annotations

import pytest

from gpulab.hami import score
from gpulab.hami.annotations import ContainerDevice, MigProfile
from gpulab.hami.config import NvidiaConfig
from gpulab.hami.device import CardFilter, ContainerRequest, RequestError, container_request
from gpulab.hami.filter import success_order, tie_note
from gpulab.hami.pods import Share, app_only_usage, collapse_init_usage
from gpulab.hami.score import CardUsage, FitOptions, NodeExtras, NodeResult, PolicyError

A100 = "NVIDIA A100-SXM4-40GB"


def card(i: int, usedmem: int = 0, used: int = 0, usedcores: int = 0, **kw: object) -> CardUsage:
    args: dict = {
        "id": f"GPU-{i}",
        "index": i,
        "type": A100,
        "count": 10,
        "totalmem": 40960,
        "totalcore": 100,
        "used": used,
        "usedmem": usedmem,
        "usedcores": usedcores,
    }
    args.update(kw)
    return CardUsage(**args)


def req(nums: int = 1, mem: int = 10000, cores: int = 0, pct: int = 101) -> ContainerRequest:
    return ContainerRequest(nums=nums, memreq=mem, mem_percentage=pct, coresreq=cores)


def opts(gpu: str = score.SPREAD, node: str = score.BINPACK, **annos: str) -> FitOptions:
    return FitOptions(gpu_policy=gpu, node_policy=node, cards=CardFilter.of(annos))


def grants(result: NodeResult) -> list[list[str]]:
    return [[g.uuid for g in ctr] for ctr in result.devices]


def fit(
    cards: list[CardUsage], *reqs: ContainerRequest, n_init: int = 0, **kw: object
) -> NodeResult:
    return score.fit_node("n", cards, reqs, n_init, **kw)  # type: ignore[arg-type]


def test_gpu_binpack_takes_the_fullest_card_and_spread_the_emptiest() -> None:
    cards = [card(0, usedmem=20000, used=1), card(1)]
    assert grants(fit(cards, req(), opts=opts(score.BINPACK))) == [["GPU-0"]]
    assert grants(fit(cards, req(), opts=opts(score.SPREAD))) == [["GPU-1"]]


def test_ties_go_to_the_lowest_card_index() -> None:
    cards = [card(2), card(0), card(1)]
    assert grants(fit(cards, req(), opts=opts(score.BINPACK))) == [["GPU-0"]]
    assert grants(fit(cards, req(), opts=opts(score.SPREAD))) == [["GPU-0"]]


def test_mutex_hands_out_idle_cards_only() -> None:
    cards = [card(0, used=1, usedmem=1000), card(1)]
    assert grants(fit(cards, req(), opts=opts(score.MUTEX))) == [["GPU-1"]]
    busy = fit([card(0, used=1, usedmem=1000)], req(), opts=opts(score.MUTEX))
    assert busy.reason == f"1/1 {score.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT}"


def test_numa_chain_orders_by_its_keys_in_the_order_written() -> None:
    # Fit walks the sorted list from the end: the last key decides among equals
    cards = [card(0, numa=0, usedmem=5000, used=1), card(1, numa=1), card(2, numa=0)]
    assert grants(fit(cards, req(), opts=opts("binpack,numa"))) == [["GPU-0"]]  # fullest
    assert grants(fit(cards, req(), opts=opts("spread,numa"))) == [["GPU-1"]]  # emptiest, NUMA 1
    assert grants(fit(cards, req(), opts=opts("numa,binpack"))) == [["GPU-1"]]  # NUMA first


def test_numa_bind_keeps_a_multi_gpu_request_on_one_numa_node() -> None:
    cards = [card(0, numa=0), card(1, numa=1), card(2, numa=1, usedmem=39000)]
    bound = fit(
        cards, req(nums=2, mem=3000), opts=opts(score.SPREAD, **{"nvidia.com/numa-bind": "true"})
    )
    assert not bound.fit and "NumaNotFit" in bound.reason
    free = fit(cards, req(nums=2, mem=3000), opts=opts(score.SPREAD))
    assert free.fit and sorted(grants(free)[0]) == ["GPU-0", "GPU-1"]


def test_topology_aware_picks_the_best_linked_pair_and_the_loneliest_single() -> None:
    cards = [card(i) for i in range(4)]
    pairs = {
        f"GPU-{a}": {f"GPU-{b}": (200 if {a, b} == {1, 2} else 20) for b in range(4) if b != a}
        for a in range(4)
    }
    pairs["GPU-3"] = {f"GPU-{b}": 10 for b in range(3)}
    for other in range(3):
        pairs[f"GPU-{other}"]["GPU-3"] = 10
    extras = NodeExtras(pair_scores=pairs)
    two = fit(cards, req(nums=2, mem=1000), opts=opts(score.TOPOLOGY), extras=extras)
    assert sorted(grants(two)[0]) == ["GPU-1", "GPU-2"]
    one = fit(cards, req(nums=1, mem=1000), opts=opts(score.TOPOLOGY), extras=extras)
    assert grants(one) == [["GPU-3"]]  # the card with the weakest links to the others


def test_reasons_are_gen_reason_strings_sorted_as_strings() -> None:
    cards = [card(0, usedmem=35000), card(1, usedmem=36000), card(2, id="GPU-x")]
    result = fit(cards, req(mem=10000), opts=opts(**{"nvidia.com/nouse-gpuuuid": "GPU-x"}))
    assert result.reason == "1/3 CardUuidMismatch, 2/3 CardInsufficientMemory"
    assert score.parse_reason(result.reason) == {"CardUuidMismatch": 1, "CardInsufficientMemory": 2}
    too_many = fit(cards, req(nums=4), opts=opts())
    assert too_many.reason == score.NODE_INSUFFICIENT_DEVICE


@pytest.mark.parametrize(
    ("cardkw", "request_", "reason"),
    [
        ({"health": False}, req(), score.CARD_NOT_HEALTH),
        ({"count": 1, "used": 1}, req(), score.CARD_TIME_SLICING_EXHAUSTED),
        ({"usedcores": 80}, req(cores=30), score.CARD_INSUFFICIENT_CORE),
        ({"used": 1, "usedcores": 10}, req(cores=100), score.CARD_INSUFFICIENT_CORE),
        ({"used": 1}, req(cores=100), score.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT),
        ({"used": 1}, req(cores=250), score.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT),  # clamped to 100
        ({"used": 2, "usedcores": 100}, req(cores=0), score.CARD_COMPUTE_UNITS_EXHAUSTED),
    ],
)
def test_card_checks(cardkw: dict, request_: ContainerRequest, reason: str) -> None:
    assert fit([card(0, **cardkw)], request_, opts=opts()).reason == f"1/1 {reason}"


def test_cordoned_cards_are_skipped() -> None:
    extras = NodeExtras(cordoned=frozenset({"GPU-0"}))
    result = fit([card(0), card(1)], req(), opts=opts(score.BINPACK), extras=extras)
    assert grants(result) == [["GPU-1"]]


def test_use_and_nouse_lists_both_apply_and_an_empty_value_is_no_constraint() -> None:
    cards = [card(0), card(1, type="NVIDIA H100 80GB HBM3"), card(2, type="NVIDIA-Tesla T4")]
    both = opts(
        score.BINPACK,
        **{"nvidia.com/use-gputype": "a100,h100", "nvidia.com/nouse-gputype": "a100"},
    )
    assert grants(fit(cards, req(), opts=both)) == [["GPU-1"]]
    uuids = opts(
        score.BINPACK,
        **{"nvidia.com/use-gpuuuid": "GPU-0,GPU-1", "nvidia.com/nouse-gpuuuid": "GPU-0"},
    )
    assert grants(fit(cards, req(), opts=uuids)) == [["GPU-1"]]
    empty = opts(score.BINPACK, **{"nvidia.com/use-gpuuuid": " ", "nvidia.com/use-gputype": ""})
    assert grants(fit(cards, req(), opts=empty)) == [["GPU-0"]]
    nothing = fit(cards, req(), opts=opts(**{"nvidia.com/use-gpuuuid": "GPU-9"}))
    assert not nothing.fit and "3/3 CardUuidMismatch" in nothing.reason


def test_vgpu_mode_annotation_must_contain_the_cards_mode() -> None:
    cards = [card(0, mode="hami-core")]
    assert not fit(cards, req(), opts=opts(**{"nvidia.com/vgpu-mode": "mig"})).fit
    assert fit(cards, req(), opts=opts(**{"nvidia.com/vgpu-mode": "hami-core"})).fit


def test_quota_is_checked_per_card() -> None:
    seen: list[tuple[int, int]] = []

    def quota(mem: int, cores: int) -> bool:
        seen.append((mem, cores))
        return mem <= 5000

    small = fit([card(0)], req(mem=4000, cores=10), opts=opts(), quota=quota)
    big = fit([card(0)], req(mem=6000, cores=10), opts=opts(), quota=quota)
    assert small.fit and not big.fit and big.reason == f"1/1 {score.RESOURCE_QUOTA_NOT_FIT}"
    assert seen == [(4000, 10), (6000, 10)]


def test_containers_fit_one_after_another_and_keep_a_slot_each() -> None:
    cards = [card(0), card(1)]
    pair = fit(cards, req(mem=30000), ContainerRequest(0), req(mem=30000), opts=opts(score.BINPACK))
    assert pair.fit and len(pair.devices) == 3 and pair.devices[1] == []
    assert grants(pair)[0] != grants(pair)[2]  # two 30000 MiB containers cannot share a card
    assert not fit(cards, req(mem=30000), req(mem=30000), req(mem=30000), opts=opts()).fit


def test_init_containers_fit_on_the_node_as_it_is_and_come_first() -> None:
    # the init container and the app container each need 30000 MiB: they run one after the
    # other, so one 40960 MiB card holds both; slots: init first
    cards = [card(0)]
    result = fit(cards, req(mem=30000), req(mem=30000), n_init=1, opts=opts())
    assert result.fit and grants(result) == [["GPU-0"], ["GPU-0"]]
    no_gpu_init = fit(cards, ContainerRequest(0), req(mem=3000, cores=30), n_init=1, opts=opts())
    from gpulab.hami.annotations import encode_pod_devices

    assert encode_pod_devices(no_gpu_init.devices) == ";GPU-0,NVIDIA,3000,30:;"
    assert cards[0].usedmem == 0  # the caller's usage is untouched


def test_init_usage_collapses_to_peak_or_sum_then_shrinks() -> None:
    init = [ContainerDevice("GPU-0", "NVIDIA", 8000, 50)]
    app = [ContainerDevice("GPU-0", "NVIDIA", 3000, 20)]
    app2 = [
        ContainerDevice("GPU-0", "NVIDIA", 3000, 20),
        ContainerDevice("GPU-1", "NVIDIA", 1000, 5),
    ]
    assert collapse_init_usage([init, app, app2], 1) == [
        Share("GPU-0", 8000, 50, 2),
        Share("GPU-1", 1000, 5, 1),
    ]
    assert app_only_usage([init, app, app2], 1) == [
        Share("GPU-0", 6000, 40, 2),
        Share("GPU-1", 1000, 5, 1),
    ]


def test_node_pick_binpack_fullest_spread_emptiest_ties_by_name() -> None:
    busy = fit([card(0, usedmem=30000, used=2, usedcores=50)], req(), opts=opts())
    busy.node = "busy"
    idle = fit([card(0)], req(), opts=opts())
    idle.node = "idle"
    assert busy.score and busy.score > (idle.score or 0)
    assert score.pick_node([busy, idle], score.BINPACK).node == "busy"  # type: ignore[union-attr]
    assert score.pick_node([busy, idle], score.SPREAD).node == "idle"  # type: ignore[union-attr]
    a, b = NodeResult("b", True, score=0.0), NodeResult("a", True, score=0.0)
    assert score.pick_node([a, b], score.BINPACK).node == "a"  # type: ignore[union-attr]
    assert score.pick_node([NodeResult("x", False, reason="r")], score.BINPACK) is None


def test_card_score_counts_the_request_only_for_an_exact_type_match() -> None:
    # upstream compares the request's type "NVIDIA" with the card's model name
    w = score.Weights()
    assert score.card_score(card(0, used=5), req(mem=4096), w) == pytest.approx(5.0)
    assert score.card_score(card(0, used=5, type="NVIDIA"), req(mem=4096), w) == pytest.approx(7.0)


def test_policies_and_weights_are_validated() -> None:
    annos = {score.NODE_POLICY_ANNOTATION: "spread", score.GPU_POLICY_ANNOTATION: "binpack,numa"}
    o = score.options_for(annos, "binpack", "spread")
    assert (o.node_policy, o.gpu_policy) == ("spread", "binpack,numa")
    with pytest.raises(PolicyError, match=r"unknown hami\.io/gpu-scheduler-policy 'topology'"):
        score.options_for({score.GPU_POLICY_ANNOTATION: "topology"}, "binpack", "spread")
    with pytest.raises(PolicyError, match="use binpack or spread"):
        score.options_for({score.NODE_POLICY_ANNOTATION: "spraed"}, "binpack", "spread")
    assert score.parse_weights("slot=1, core=2,memory=3") == score.Weights(1, 2, 3)
    for bad in (
        "slot=1,core=1",
        "slot=1,core=1,mem=1",
        "slot=0,core=0,memory=0",
        "slot=-1,core=1,memory=1",
    ):
        with pytest.raises(PolicyError, match=r"hami\.io/device-scoring-weights"):
            score.parse_weights(bad)


def test_requests_follow_generate_resource_requests() -> None:
    cfg = NvidiaConfig()
    limits = {"resources": {"limits": {"nvidia.com/gpu": "2"}}}
    whole = container_request(limits, cfg)
    assert (whole.nums, whole.memreq, whole.mem_percentage, whole.coresreq) == (2, 0, 100, 0)
    defaulted = container_request(limits, NvidiaConfig(default_memory=3000, default_cores=20))
    assert (defaulted.memreq, defaulted.coresreq) == (3000, 20)
    # quantities as the API server may rewrite them; "4Gi" MiB does not fit int32: refused
    assert (
        container_request(
            {"resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10k"}}}, cfg
        ).memreq
        == 10000
    )
    assert (
        container_request(
            {"resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4Gi"}}}, cfg
        ).nums
        == 0
    )
    assert container_request({"resources": {"limits": {"nvidia.com/gpu": "1.5"}}}, cfg).nums == 0
    pct = container_request(
        {"resources": {"requests": {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "150"}}},
        cfg,
    )
    assert pct.mem_percentage == 100
    zero = container_request(
        {"resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "0"}}}, cfg
    )
    assert zero.mem_percentage == 100  # not positive: ignored, then the whole card
    with pytest.raises(RequestError):
        container_request({"resources": {"limits": {"nvidia.com/gpu": "lots"}}}, cfg)
    with pytest.raises(RequestError):
        container_request({"resources": {"limits": ["nvidia.com/gpu"]}}, cfg)


# ------------------------------------------------------------ MIG mode

A100_MIG = (  # what the device plugin discovers on an A100-40GB for the chart's allowlist
    MigProfile("1g.5gb", 4864, 15, 1, tuple((s, 1) for s in range(7))),
    MigProfile("2g.10gb", 9856, 29, 2, ((0, 2), (2, 2), (4, 2))),
    MigProfile("3g.20gb", 19968, 43, 3, ((0, 4), (4, 4))),
    MigProfile("7g.40gb", 40192, 100, 7, ((0, 8),)),
)


def mig_card(i: int, **kw: object) -> CardUsage:
    return card(i, mode="mig", count=7, mig_profiles=A100_MIG, **kw)


def test_the_smallest_profile_that_holds_the_memory_and_1g_3g_placed_from_the_top() -> None:
    """selectMigCandidate + orderedMigPlacements: 3000 MiB is a 1g.5gb at the highest start;
    then 15000 MiB a 3g.20gb, whose high start (4) overlaps it, so at 0."""
    one_g = score.select_mig_candidate(A100_MIG, [], 3000)
    assert one_g is not None and (one_g[0].name, one_g[1]) == ("1g.5gb", (6, 1))
    three_g = score.select_mig_candidate(A100_MIG, [(6, 1)], 15000)
    assert three_g is not None and (three_g[0].name, three_g[1]) == ("3g.20gb", (0, 4))
    two_g = score.select_mig_candidate(A100_MIG, [], 6000)  # 2g from the lowest start up
    assert two_g is not None and (two_g[0].name, two_g[1]) == ("2g.10gb", (0, 2))
    assert score.select_mig_candidate(A100_MIG, [(0, 4), (4, 4)], 1000) is None
    assert score.select_mig_candidate(A100_MIG, [], 50000) is None


def test_a_mig_share_is_charged_its_profile_and_reserves_a_placement() -> None:
    cards = [mig_card(0)]
    first = fit(cards, req(mem=3000), opts=opts())
    (share,) = first.devices[0]
    assert (share.usedmem, share.usedcores, share.mig) == (4864, 15, ("1g.5gb", 6, 1))
    cards[0].mig_in_use.append((6, 1))  # the node's books after Filter charged the pod
    cards[0].used, cards[0].usedmem, cards[0].usedcores = 1, 4864, 15
    (second,) = fit(cards, req(mem=15000), opts=opts()).devices[0]
    assert second.mig == ("3g.20gb", 0, 4) and second.usedmem == 19968
    cards[0].mig_in_use.append((0, 4))
    # another 3g.20gb has no free placement left: the MIG reason, not a memory one
    refused = fit(cards, req(mem=15000), opts=opts())
    assert not refused.fit and refused.reason == "1/1 CardMigTopologyInfeasible"


def test_one_container_may_take_several_instances_of_one_mig_gpu() -> None:
    """Fit tries a MIG-mode card again for the container's next share, and a MIG request
    is not refused for asking more GPUs than the node has (isMIGRequest)."""
    got = fit([mig_card(0)], req(nums=2, mem=15000), opts=opts())
    assert [(g.uuid, g.mig) for g in got.devices[0]] == [
        ("GPU-0", ("3g.20gb", 4, 4)),
        ("GPU-0", ("3g.20gb", 0, 4)),
    ]
    hami_core = fit([card(0)], req(nums=2), opts=opts())
    assert hami_core.reason == score.NODE_INSUFFICIENT_DEVICE


def test_vgpu_mode_keeps_hami_core_pods_off_mig_gpus_and_mig_pods_off_the_rest() -> None:
    cards = [card(0), mig_card(1)]
    core = fit(cards, req(mem=3000), opts=opts(**{"nvidia.com/vgpu-mode": "hami-core"}))
    mig = fit(cards, req(mem=3000), opts=opts(**{"nvidia.com/vgpu-mode": "mig"}))
    assert grants(core) == [["GPU-0"]] and core.devices[0][0].mig is None
    assert grants(mig) == [["GPU-1"]] and mig.devices[0][0].mig == ("1g.5gb", 6, 1)


def test_a_tie_says_why_the_chosen_node_won() -> None:
    """Idle GPUs score 0.00 everywhere: the Filter line says the tie went to the first node
    by name (the last of success_order), not that its score was best."""
    idle = [NodeResult(n, True, score=0.0) for n in ("gpu-t4", "gpu-a100", "gpu-h100")]
    ordered = success_order(idle, score.BINPACK)
    assert ordered[-1].node == "gpu-a100"
    assert tie_note(ordered) == (
        ", 3 tie at score 0.00: the first by name wins (upstream's sort leaves ties in no "
        "set order)"
    )
    busy = [NodeResult("gpu-t4", True, score=2.5), *idle[1:]]
    assert success_order(busy, score.BINPACK)[-1].node == "gpu-t4"
    assert tie_note(success_order(busy, score.BINPACK)) == ""
