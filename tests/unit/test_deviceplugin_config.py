"""Upstream's config file format (api/config/v1) and its flag precedence."""

from __future__ import annotations

import pytest

from gpulab.deviceplugin.config import (
    Config,
    ConfigError,
    FlagOverrides,
    ReplicatedResource,
    merge,
    parse,
    render,
    time_slicing,
)

UPSTREAM_EXAMPLE = """
version: v1
flags:
  migStrategy: "mixed"
  failOnInitError: true
  nvidiaDriverRoot: "/"
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: envvar
    deviceIDStrategy: uuid
sharing:
  timeSlicing:
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 10
"""


def test_the_upstream_example_file_parses() -> None:
    config = parse(UPSTREAM_EXAMPLE)
    assert config.mig_strategy == "mixed"
    assert config.time_slicing.resources == (ReplicatedResource("nvidia.com/gpu", 10),)
    assert config.time_slicing.fail_requests_greater_than_one is True
    assert config.sharing_strategy == "time-slicing"
    # keys upstream knows that the lab does not act on are accepted and listed
    assert "flags.nvidiaDriverRoot" in config.ignored
    assert "flags.plugin.deviceListStrategy" in config.ignored


def test_an_empty_file_is_the_defaults() -> None:
    assert parse("") == Config()
    assert Config().sharing_strategy == "none"


def test_a_short_resource_name_gets_the_nvidia_prefix() -> None:
    config = parse("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2}]}}")
    assert config.time_slicing.resources[0].name == "nvidia.com/gpu"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: v2", "unknown version: v2"),
        ("flags: {migStrategy: auto}", "flags.migStrategy 'auto' is not valid"),
        ("sharing: {timeslicing: {}}", "sharing has unknown key(s) timeslicing"),
        ("sharing: {timeSlicing: {resources: []}}", "no resources specified"),
        ("sharing: {timeSlicing: {resources: [{replicas: 2}]}}", "no resource name specified"),
        ("sharing: {timeSlicing: {resources: [{name: gpu}]}}", "no replicas specified"),
        (
            "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 1}]}}",
            "number of replicas must be >= 2",
        ),
        (
            "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: some}]}}",
            "the only valid string input is 'all'",
        ),
        ("sharing: {mps: {resources: [{name: gpu, replicas: 2}]}}", "sharing.mps is not"),
        ("flags: [1]", "flags must be a mapping"),
        ("{", "not valid YAML"),
    ],
)
def test_bad_files_are_one_line_errors_naming_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(text, "cfg.yaml")
    assert message in str(err.value)
    assert str(err.value).startswith("cfg.yaml: ") and "\n" not in str(err.value)


def test_rename_is_ignored_unless_rename_by_default_as_v0_20_0() -> None:
    custom = parse(
        "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, rename: gpu-shared}]}}"
    )
    assert custom.time_slicing.resources[0].rename == ""
    assert any("rename is not yet supported" in w for w in custom.warnings)
    default = parse(
        "sharing: {timeSlicing: {renameByDefault: true, resources: [{name: gpu, replicas: 2}]}}"
    )
    assert default.time_slicing.resources[0].rename == "nvidia.com/gpu.shared"
    assert default.warnings == ()


def test_flags_set_explicitly_win_over_the_file() -> None:
    config = parse("flags: {migStrategy: mixed, plugin: {passDeviceSpecs: false}}")
    assert merge(config, FlagOverrides()) == config
    merged = merge(config, FlagOverrides(mig_strategy="single", pass_device_specs=True))
    assert (merged.mig_strategy, merged.pass_device_specs) == ("single", True)
    with pytest.raises(ConfigError, match="MIG strategy 'x'"):
        merge(config, FlagOverrides(mig_strategy="x"))


def test_render_round_trips_through_parse() -> None:
    for config in (
        Config(),
        Config(mig_strategy="mixed"),
        Config(time_slicing=time_slicing(4), pass_device_specs=True),
    ):
        assert parse(render(config)) == config
    assert "sharing" not in render(Config())
