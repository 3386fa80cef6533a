"""The device plugin's configuration: upstream's config file format and its flag overrides.

Mirrors NVIDIA k8s-device-plugin v0.20.0 ``api/config/v1`` (``config.go`` ``NewConfig`` /
``parseConfigFrom``, ``flags.go``, ``sharing.go``, ``replicas.go``, ``resources.go``,
``consts.go``) and ``DisableResourceNamingInConfig`` as ``cmd/nvidia-device-plugin/main.go``
applies it. A config file (``--config-file``) looks like::

    version: v1
    flags:
      migStrategy: mixed              # none | single | mixed
      failOnInitError: true
      plugin:
        passDeviceSpecs: false
        sharedDevicesAllocationPolicy: distributed   # or packed
    sharing:
      timeSlicing:
        renameByDefault: false
        failRequestsGreaterThanOne: false
        resources:
          - name: nvidia.com/gpu
            replicas: 4

Precedence as upstream: a flag or its environment variable that was set explicitly wins
over the file, the file wins over the flag's default. Pure: text in, :class:`Config` out.

Deliberate differences: a key upstream does not know is an error naming it (upstream's
YAML decoder silently ignores a misspelt ``timeslicing``); keys upstream knows but the lab
does not model (CDI, GDS, IMEX ...) are accepted and listed in ``ignored``; ``sharing.mps``
is refused (the lab runs no MPS control daemon).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from gpulab.errors import UserError

VERSION = "v1"
RESOURCE_PREFIX = "nvidia.com"
SHARED_SUFFIX = ".shared"
MAX_RESOURCE_NAME = 63
MIG_STRATEGIES = ("none", "single", "mixed")
ALLOCATION_POLICIES = ("distributed", "packed")
SHARING_NONE = "none"
SHARING_TIME_SLICING = "time-slicing"

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

# What upstream's structs know, and which of it the lab acts on.
_TOP = {"version", "flags", "resources", "sharing", "imex"}
_FLAGS_USED = {"migStrategy", "failOnInitError", "plugin"}
_FLAGS_IGNORED = {
    "mpsRoot", "nvidiaDriverRoot", "nvidiaDevRoot", "gdrcopyEnabled", "gdsEnabled",
    "mofedEnabled", "useNodeFeatureAPI", "deviceDiscoveryStrategy", "gfd",
}  # fmt: skip
_PLUGIN_USED = {"passDeviceSpecs", "sharedDevicesAllocationPolicy"}
_PLUGIN_IGNORED = {
    "deviceListStrategy", "deviceIDStrategy", "cdiAnnotationPrefix", "nvidiaCTKPath",
    "containerDriverRoot",
}  # fmt: skip
_SHARING = {"timeSlicing", "mps"}
_PLUGIN_DEFAULTS = {"passDeviceSpecs": False, "sharedDevicesAllocationPolicy": "distributed"}
_REPLICATED = {"renameByDefault", "failRequestsGreaterThanOne", "resources"}
_RESOURCE = {"name", "rename", "devices", "replicas"}


class ConfigError(UserError, ValueError):
    """The config file or a flag is not valid; the message names the key and the fix."""


@dataclass(frozen=True)
class ReplicatedResource:
    """One entry of ``sharing.timeSlicing.resources`` (upstream ``ReplicatedResource``)."""

    name: str
    replicas: int
    rename: str = ""  # "" keeps the name; set only by renameByDefault (see below)


@dataclass(frozen=True)
class TimeSlicing:
    """``sharing.timeSlicing`` (upstream ``ReplicatedResources``)."""

    rename_by_default: bool = False
    fail_requests_greater_than_one: bool | None = None
    resources: tuple[ReplicatedResource, ...] = ()

    def replicated(self) -> bool:
        return any(r.replicas > 1 for r in self.resources)

    def for_resource(self, name: str) -> ReplicatedResource | None:
        return next((r for r in self.resources if r.name == name), None)


@dataclass(frozen=True)
class Config:
    """What the plugin runs with, after the file and the flags are merged."""

    mig_strategy: str = "none"
    fail_on_init_error: bool = True
    pass_device_specs: bool = False
    allocation_policy: str = "distributed"
    time_slicing: TimeSlicing = field(default_factory=TimeSlicing)
    ignored: tuple[str, ...] = ()  # keys upstream knows that the lab does not act on
    warnings: tuple[str, ...] = ()  # what DisableResourceNamingInConfig overrode

    @property
    def sharing_strategy(self) -> str:
        """Upstream ``Sharing.SharingStrategy`` (MPS is refused at parse time)."""
        return SHARING_TIME_SLICING if self.time_slicing.replicated() else SHARING_NONE

    def to_json(self) -> dict[str, Any]:
        """The config as upstream logs it at start ("Running with config")."""
        sharing: dict[str, Any] = {}
        if self.time_slicing.resources:
            ts: dict[str, Any] = {
                "renameByDefault": self.time_slicing.rename_by_default,
                "resources": [
                    {"name": r.name, "devices": "all", "replicas": r.replicas}
                    | ({"rename": r.rename} if r.rename else {})
                    for r in self.time_slicing.resources
                ],
            }
            if self.time_slicing.fail_requests_greater_than_one is not None:
                ts["failRequestsGreaterThanOne"] = self.time_slicing.fail_requests_greater_than_one
            sharing["timeSlicing"] = ts
        return {
            "version": VERSION,
            "flags": {
                "migStrategy": self.mig_strategy,
                "failOnInitError": self.fail_on_init_error,
                "plugin": {
                    "passDeviceSpecs": self.pass_device_specs,
                    "sharedDevicesAllocationPolicy": self.allocation_policy,
                },
            },
            "sharing": sharing,
        }


@dataclass(frozen=True)
class FlagOverrides:
    """Flags (or their environment variables) the user set explicitly; None = not set."""

    mig_strategy: str | None = None
    fail_on_init_error: bool | None = None
    pass_device_specs: bool | None = None
    allocation_policy: str | None = None


def resource_name(raw: Any, where: str) -> str:
    """Upstream ``NewResourceName``: ``gpu`` becomes ``nvidia.com/gpu``; checked like it."""
    if not isinstance(raw, str) or not raw:
        raise ConfigError(f"{where} must be a resource name such as nvidia.com/gpu")
    name = raw if raw.startswith(f"{RESOURCE_PREFIX}/") else f"{RESOURCE_PREFIX}/{raw}"
    if len(name) > MAX_RESOURCE_NAME:
        raise ConfigError(
            f"{where}: fully-qualified resource name must be {MAX_RESOURCE_NAME} characters "
            f"or less: {name}"
        )
    short = name.split("/", 1)[1]
    if not _DNS_SUBDOMAIN.match(short):
        raise ConfigError(
            f"{where}: incorrect format for resource name {name!r}: use lower-case letters, "
            "digits, '-' and '.'"
        )
    return name


def _mapping(value: Any, where: str, known: set[str], ignored: list[str], lab_ignores=()) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a mapping")
    unknown = sorted(set(value) - known - set(lab_ignores))
    if unknown:
        choices = ", ".join(sorted(known | set(lab_ignores)))
        raise ConfigError(f"{where} has unknown key(s) {', '.join(unknown)}; known: {choices}")
    ignored += [f"{where}.{k}" for k in sorted(set(value) & set(lab_ignores))]
    return dict(value)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    return value


def _choice(value: Any, where: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ConfigError(f"{where} {value!r} is not valid; use one of: {', '.join(choices)}")
    return value


def _replicated_resource(raw: Any, where: str, ignored: list[str]) -> tuple[str, int, str, bool]:
    """(name, replicas, rename, devices-all) of one entry, checked as upstream unmarshals it."""
    entry = _mapping(raw, where, _RESOURCE, ignored)
    if "name" not in entry:
        raise ConfigError(f"{where}: no resource name specified")
    name = resource_name(entry["name"], f"{where}.name")
    if "replicas" not in entry:
        raise ConfigError(f"{where}: no replicas specified")
    replicas = entry["replicas"]
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 2:
        raise ConfigError(f"{where}.replicas: number of replicas must be >= 2, got {replicas!r}")
    rename = resource_name(entry["rename"], f"{where}.rename") if "rename" in entry else ""
    devices = entry.get("devices", "all")
    if isinstance(devices, str) and devices != "all":
        raise ConfigError(
            f"{where}.devices set as {devices!r} but the only valid string input is 'all'"
        )
    if isinstance(devices, int) and not isinstance(devices, bool) and devices <= 0:
        raise ConfigError(f"{where}.devices: a count of devices must be > 0")
    if not isinstance(devices, str | int | list) or isinstance(devices, bool):
        raise ConfigError(f"{where}.devices: use 'all', a count or a list of GPU indexes/UUIDs")
    return name, replicas, rename, devices == "all"


def _time_slicing(raw: Any, ignored: list[str], warnings: list[str]) -> TimeSlicing:
    where = "sharing.timeSlicing"
    ts = _mapping(raw, where, _REPLICATED, ignored)
    if not ts:
        return TimeSlicing()
    rename_by_default = _bool(ts.get("renameByDefault", False), f"{where}.renameByDefault")
    fail_gt_one = ts.get("failRequestsGreaterThanOne")
    if fail_gt_one is not None:
        fail_gt_one = _bool(fail_gt_one, f"{where}.failRequestsGreaterThanOne")
    entries = ts.get("resources")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{where}: no resources specified (a list of {{name, replicas}})")
    resources = []
    for i, raw_entry in enumerate(entries):
        name, replicas, rename, all_devices = _replicated_resource(
            raw_entry, f"{where}.resources[{i}]", ignored
        )
        # DisableResourceNamingInConfig: only renameByDefault's "<name>.shared" survives,
        # and every device of the resource is replicated.
        default = f"{name}{SHARED_SUFFIX}"
        wanted = rename or (default if rename_by_default else "")
        effective = default if rename_by_default else ""
        if wanted != effective:
            warnings.append(
                f"{where}.resources[{i}].rename is not yet supported (as upstream v0.20.0); "
                f"ignoring {rename!r}"
            )
        if not all_devices:
            warnings.append(
                f"{where}.resources[{i}].devices other than 'all' is not yet supported (as "
                "upstream v0.20.0); replicating every device"
            )
        resources.append(ReplicatedResource(name, replicas, effective))
    return TimeSlicing(rename_by_default, fail_gt_one, tuple(resources))


def parse(text: str, source: str = "config file") -> Config:
    """A config file's text (YAML or JSON) as a :class:`Config`; ConfigError names the key."""
    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML or JSON ({exc.__class__.__name__})") from exc
    if data is None:
        data = {}
    ignored: list[str] = []
    warnings: list[str] = []
    try:
        top = _mapping(
            data, "the config", _TOP - {"resources", "imex"}, ignored, ("resources", "imex")
        )
        version = top.get("version") or VERSION
        if version != VERSION:
            raise ConfigError(f"unknown version: {version} (this plugin reads version: {VERSION})")
        flags = _mapping(top.get("flags"), "flags", _FLAGS_USED, ignored, _FLAGS_IGNORED)
        plugin = _mapping(
            flags.get("plugin"), "flags.plugin", _PLUGIN_USED, ignored, _PLUGIN_IGNORED
        )
        sharing = _mapping(top.get("sharing"), "sharing", _SHARING, ignored)
        if sharing.get("mps") is not None:
            raise ConfigError(
                "sharing.mps is not simulated by the lab (no MPS control daemon); "
                "use sharing.timeSlicing"
            )
        config = Config()
        if flags.get("migStrategy") is not None:
            config = replace(
                config,
                mig_strategy=_choice(flags["migStrategy"], "flags.migStrategy", MIG_STRATEGIES),
            )
        if flags.get("failOnInitError") is not None:
            config = replace(
                config, fail_on_init_error=_bool(flags["failOnInitError"], "flags.failOnInitError")
            )
        if plugin.get("passDeviceSpecs") is not None:
            config = replace(
                config,
                pass_device_specs=_bool(plugin["passDeviceSpecs"], "flags.plugin.passDeviceSpecs"),
            )
        if plugin.get("sharedDevicesAllocationPolicy") is not None:
            config = replace(
                config,
                allocation_policy=_choice(
                    plugin["sharedDevicesAllocationPolicy"],
                    "flags.plugin.sharedDevicesAllocationPolicy",
                    ALLOCATION_POLICIES,
                ),
            )
        ts = _time_slicing(sharing.get("timeSlicing"), ignored, warnings)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return replace(config, time_slicing=ts, ignored=tuple(ignored), warnings=tuple(warnings))


def merge(config: Config, flags: FlagOverrides) -> Config:
    """Upstream ``UpdateFromCLIFlags``: flags set explicitly override the file."""
    if flags.mig_strategy is not None:
        config = replace(
            config, mig_strategy=_choice(flags.mig_strategy, "MIG strategy", MIG_STRATEGIES)
        )
    if flags.fail_on_init_error is not None:
        config = replace(config, fail_on_init_error=flags.fail_on_init_error)
    if flags.pass_device_specs is not None:
        config = replace(config, pass_device_specs=flags.pass_device_specs)
    if flags.allocation_policy is not None:
        config = replace(
            config,
            allocation_policy=_choice(
                flags.allocation_policy, "--shared-devices-allocation-policy", ALLOCATION_POLICIES
            ),
        )
    return config


def time_slicing(replicas: int, resource: str = "nvidia.com/gpu") -> TimeSlicing:
    """``replicas`` time-sliced copies of every device of ``resource`` (1: no sharing)."""
    if replicas <= 1:
        return TimeSlicing()
    return TimeSlicing(resources=(ReplicatedResource(resource, replicas),))


def render(config: Config) -> str:
    """The config in upstream's file format, with the settings that differ from the
    defaults (what an entry of the configs ConfigMap holds)."""
    full = config.to_json()
    flags: dict[str, Any] = {"migStrategy": config.mig_strategy}
    if not config.fail_on_init_error:
        flags["failOnInitError"] = False
    plugin = {k: v for k, v in full["flags"]["plugin"].items() if v != _PLUGIN_DEFAULTS[k]}
    if plugin:
        flags["plugin"] = plugin
    doc: dict[str, Any] = {"version": VERSION, "flags": flags}
    if full["sharing"]:
        doc["sharing"] = full["sharing"]
    return yaml.safe_dump(doc, sort_keys=False)
