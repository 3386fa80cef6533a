"""mig-parted v0.15.0's config format and decisions: parsing, selection per GPU, asserting
what is applied, and the lab's check that a layout fits before anything changes."""

from __future__ import annotations

import pytest
import yaml

from gpulab.gpuoperator import migparted as mp
from gpulab.gpuoperator.migparted import GiProfile, Gpu, MigConfigError, Target
from harness.apply import MANIFESTS

SHIPPED = MANIFESTS / "gpu-operator/assets/state-mig-manager/0400_configmap.yaml"
A100_40 = 0x20B010DE
A100_80 = 0x20B210DE
T4 = 0x1EB810DE


def shipped_spec() -> mp.Spec:
    return mp.parse_spec(yaml.safe_load(SHIPPED.read_text())["data"]["config.yaml"])


def a100_40(index: int = 0, current: dict[str, int] | None = None) -> Gpu:
    profiles = {
        "1g.5gb": GiProfile("1g.5gb", 19, 1, 4864, 7),
        "1g.10gb": GiProfile("1g.10gb", 15, 1, 9856, 4),
        "2g.10gb": GiProfile("2g.10gb", 14, 2, 9856, 3),
        "3g.20gb": GiProfile("3g.20gb", 9, 3, 19968, 2),
        "7g.40gb": GiProfile("7g.40gb", 0, 7, 40192, 1),
    }
    return Gpu(index, "NVIDIA A100-SXM4-40GB", A100_40, True, current is not None, 40960,
               profiles, current or {})  # fmt: skip


def t4(index: int) -> Gpu:
    return Gpu(index, "Tesla T4", T4, mig_capable=False, memory_mib=15360)


def test_upstreams_default_configmap_parses_with_its_names() -> None:
    spec = shipped_spec()
    assert {"all-disabled", "all-enabled", "all-1g.10gb", "all-balanced", "all-1g.5gb.me"} <= set(
        spec.mig_configs
    )
    (entry,) = spec.mig_configs["all-disabled"]
    assert entry == mp.MigConfigSpec("all", False, {}, ())


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false}]}\nextra: 1",
         "unexpected field: extra"),
        ("mig-configs: {a: [{devices: all, mig-enabled: false}]}",
         "unable to parse with missing 'version' field"),
        ("version: v2\nmig-configs: {}", "unknown version: v2"),
        ("version: v1\nmig-configs: {}", "at least one entry in 'mig-configs' is required"),
        ("version: v1\nmig-configs: {a: []}", "at least one entry in 'a' is required"),
        ("version: v1\nmig-configs: {a: [{mig-enabled: true}]}", "missing required field: devices"),
        ("version: v1\nmig-configs: {a: [{devices: some, mig-enabled: false}]}",
         "invalid string input for 'devices': some"),
        ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true}]}",
         "missing required field 'mig-devices'"),
        ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, "
         "mig-devices: {1g.5gb: 1}}]}", "MIG devices included when 'mig-enabled' is false"),
        ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, "
         "mig-devices: {1g.5gb: 0}}]}", "all counts for all MigProfiles are 0"),
        ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, "
         "mig-devices: {1gb.5g: 1}}]}", "cannot parse fields of '1gb.5g'"),
        ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, "
         "mig-devices: {1g.5gb: -1}}]}", "invalid count for '1g.5gb'"),
        ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, "
         "device-filter: nope, mig-devices: {}}]}", "invalid device-filter 'nope'"),
        ("version: v1\nmig-configs:\n  a: [{devices: all\n", "unmarshal error: not valid YAML"),
        ("just text", "unmarshal error"),
    ],
)  # fmt: skip
def test_a_bad_config_fails_with_one_line(text: str, error: str) -> None:
    with pytest.raises(MigConfigError, match=error.replace("(", r"\(").replace(")", r"\)")) as exc:
        mp.parse_spec(text)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("1g.10gb", mp.MigProfile(1, 1, 10)),
        ("1c.3g.20gb", mp.MigProfile(1, 3, 20)),
        ("1g.5gb+me", mp.MigProfile(1, 1, 5, ("me",))),
        ("1g.24gb+me.all", mp.MigProfile(1, 1, 24, ("me.all",))),
        ("1g.24gb-me", mp.MigProfile(1, 1, 24, (), ("me",))),
    ],
)
def test_mig_profile_names(name: str, parsed: mp.MigProfile) -> None:
    assert mp.parse_profile(name) == parsed
    assert str(parsed) == name


@pytest.mark.parametrize("bad", ["", "1g", "1g.5gb+me-gfx", "1x.5gb", "1g.5gb+me,me", "1g.5gb+9x"])
def test_bad_mig_profile_names(bad: str) -> None:
    with pytest.raises(MigConfigError):
        mp.parse_profile(bad)


def test_device_filters_pick_the_a100_40gb_row_of_all_1g_10gb() -> None:
    specs = mp.select(shipped_spec(), "all-1g.10gb")
    gpus = [a100_40(0), a100_40(1), t4(2)]
    assert mp.layout(specs, gpus) == {
        0: Target(True, {"1g.10gb": 4}),
        1: Target(True, {"1g.10gb": 4}),
    }
    a100_80 = Gpu(0, "NVIDIA A100-SXM4-80GB", A100_80, True)
    assert mp.layout(specs, [a100_80]) == {0: Target(True, {"1g.10gb": 7})}


def test_an_unknown_config_name() -> None:
    with pytest.raises(MigConfigError, match="selected mig-config not present: all-bogus"):
        mp.select(shipped_spec(), "all-bogus")


def test_devices_by_index_and_later_entries_win() -> None:
    spec = mp.parse_spec(
        "version: v1\nmig-configs:\n  custom:\n"
        "  - {devices: all, mig-enabled: false}\n"
        "  - {devices: [1], mig-enabled: true, mig-devices: {3g.20gb: 2}}\n"
    )
    gpus = [a100_40(0), a100_40(1)]
    assert mp.layout(mp.select(spec, "custom"), gpus) == {
        0: Target(False, {}),
        1: Target(True, {"3g.20gb": 2}, all_devices=False),
    }


@pytest.mark.parametrize(
    ("devices", "problem"),
    [
        ({"1g.10gb": 4}, None),
        ({"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}, None),
        ({"1g.10gb": 5}, "GPU 0 (NVIDIA A100-SXM4-40GB) holds at most 4 x 1g.10gb, not 5"),
        ({"3g.20gb": 3}, "holds at most 2 x 3g.20gb, not 3"),
        ({"3g.20gb": 2, "1g.5gb": 1}, "cannot hold 1x 1g.5gb + 2x 3g.20gb: 9 memory slices > 8"),
        ({"2g.10gb": 3, "1g.10gb": 2}, "cannot hold 2x 1g.10gb + 3x 2g.10gb: 8 compute slices > 7"),
        ({"1g.20gb": 1}, "has no MIG profile 1g.20gb (it has: 1g.10gb, 1g.5gb, 2g.10gb, "),
    ],
)
def test_check_says_why_a_layout_does_not_fit(devices: dict, problem: str | None) -> None:
    problems = mp.check({0: Target(True, devices)}, [a100_40(0)])
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problem in problems[0]


def test_a_gpu_without_mig_is_skipped_unless_named_by_index() -> None:
    assert mp.check({0: Target(True, {"1g.5gb": 1})}, [t4(0)]) == []
    assert mp.check({0: Target(True, {"1g.5gb": 1}, all_devices=False)}, [t4(0)]) == [
        "GPU 0 (Tesla T4) is not MIG capable"
    ]


def test_assert_mode_and_config() -> None:
    want = {0: Target(True, {"1g.10gb": 4}), 1: Target(False, {})}
    off = [a100_40(0), a100_40(1), t4(2)]
    assert not mp.mode_applied(want, off)
    on_empty = [a100_40(0, {}), a100_40(1)]
    assert mp.mode_applied(want, on_empty) and not mp.config_applied(want, on_empty)
    done = [a100_40(0, {"1g.10gb": 4}), a100_40(1)]
    assert mp.config_applied(want, done)
    assert mp.config_applied({}, off)  # nothing selected: nothing to do


def test_flatten_puts_the_largest_instances_first() -> None:
    assert mp.flatten({"1g.5gb": 2, "3g.20gb": 1, "2g.10gb": 1, "1c.3g.20gb": 0}) == [
        "3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb",
    ]  # fmt: skip


def a100_80(index: int) -> Gpu:
    profiles = {
        "1g.10gb": GiProfile("1g.10gb", 19, 1, 9728, 7),
        "1g.20gb": GiProfile("1g.20gb", 15, 1, 19968, 4),
        "2g.20gb": GiProfile("2g.20gb", 14, 2, 19968, 3),
        "3g.40gb": GiProfile("3g.40gb", 9, 3, 40192, 2),
        "7g.80gb": GiProfile("7g.80gb", 0, 7, 80384, 1),
    }
    return Gpu(index, "NVIDIA A100-SXM4-80GB", A100_80, True, False, 81920, profiles)


def test_the_config_built_from_one_kind_of_gpu_has_no_device_filters() -> None:
    """pkg/mig/builder: every profile at its maximum count, all-balanced from the base
    profiles of most instances, the two base configs; a T4 (no MIG) is left out."""
    spec = mp.build_config([a100_40(0), a100_40(1), t4(2)])
    assert spec["version"] == "v1"
    configs = spec["mig-configs"]
    assert list(configs) == [
        "all-1g.5gb", "all-1g.10gb", "all-2g.10gb", "all-3g.20gb", "all-7g.40gb",
        "all-balanced", "all-disabled", "all-enabled",
    ]  # fmt: skip
    assert configs["all-1g.10gb"] == [
        {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 4}}
    ]
    assert configs["all-balanced"] == [
        {"devices": "all", "mig-enabled": True,
         "mig-devices": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}}
    ]  # fmt: skip
    assert configs["all-disabled"] == [{"devices": "all", "mig-enabled": False, "mig-devices": {}}]
    # what the MIG manager writes parses back, and a layout from it selects every A100
    text = mp.config_yaml(spec)
    assert text.startswith("# DO NOT EDIT: Auto-generated MIG configuration from GPU hardware.\n")
    parsed = mp.parse_spec(text)
    gpus = [a100_40(0), a100_40(1), t4(2)]
    assert mp.layout(mp.select(parsed, "all-1g.10gb"), gpus) == {
        0: Target(True, {"1g.10gb": 4}),
        1: Target(True, {"1g.10gb": 4}),
        2: Target(True, {"1g.10gb": 4}),  # selected, skipped by apply (not MIG capable)
    }


def test_two_kinds_of_gpu_get_device_filters_grouped_by_maximum_count() -> None:
    spec = mp.build_config([a100_40(0), a100_80(1)])
    configs = spec["mig-configs"]
    assert configs["all-1g.10gb"] == [
        {"device-filter": ["0x20B010DE"], "devices": "all", "mig-enabled": True,
         "mig-devices": {"1g.10gb": 4}},
        {"device-filter": ["0x20B210DE"], "devices": "all", "mig-enabled": True,
         "mig-devices": {"1g.10gb": 7}},
    ]  # fmt: skip
    assert [r["device-filter"] for r in configs["all-balanced"]] == [["0x20B010DE"], ["0x20B210DE"]]
    assert configs["all-balanced"][1]["mig-devices"] == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    assert "device-filter: ['0x20B010DE']" in mp.config_yaml(spec)  # a flow sequence
    assert mp.parse_spec(mp.config_yaml(spec)).mig_configs["all-1g.10gb"][1].device_filter == (
        "0x20B210DE",
    )


def test_no_profiles_or_no_mig_capable_gpu() -> None:
    with pytest.raises(mp.NoMigCapableGpuError, match="no MIG-capable devices found"):
        mp.build_config([t4(0)])
    bare = Gpu(0, "NVIDIA A100-SXM4-40GB", A100_40, True)  # NVML listed no profile
    with pytest.raises(mp.NoProfilesDiscoveredError, match="no MIG profiles discovered"):
        mp.build_config([bare])
