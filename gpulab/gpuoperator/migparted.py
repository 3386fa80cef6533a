"""mig-parted's config file and decisions: which GPU gets which MIG layout, and is it there.

Mirrors NVIDIA mig-parted v0.15.0:
- ``api/spec/v1/spec.go`` (``Spec``/``MigConfigSpec`` and their strict unmarshalling:
  ``version: v1``, ``mig-configs`` of non-empty lists, ``devices`` ``all`` or indexes,
  ``device-filter`` PCI device IDs, ``mig-enabled``, ``mig-devices`` required when
  enabled and forbidden when not) and ``api/spec/v1/helpers.go`` (device selection);
- ``pkg/types/mig_config.go`` (``AssertValidFormat``, ``Equals``, ``Flatten``'s order:
  largest instances first) with go-nvlib's MIG profile names (``<g>g.<gb>gb``,
  ``<c>c.<g>g.<gb>gb``, ``+attr``/``-attr``);
- ``cmd/nvidia-mig-parted/assert`` (``GetSelectedMigConfig``,
  ``WalkSelectedMigConfigForEachGPU``, ``AssertMigMode``/``AssertMigConfig``) and the
  checks of ``apply`` (``ApplyMigMode``/``ApplyMigConfig``);
- ``pkg/mig/discovery`` (``discoverProfiles``: the GPU-instance profiles of each
  MIG-capable GPU with their instance counts) and ``pkg/mig/builder``
  (``buildMigConfigSpec``, ``buildAllBalancedConfig``, ``GenerateConfigYAML``): the
  config the MIG manager builds from the hardware - ``all-disabled``, ``all-enabled``,
  ``all-balanced`` and one ``all-<profile>`` per profile at its maximum count,
  ``device-filter`` rows only when the node has several kinds of MIG-capable GPU.

Pure: GPUs come in as :class:`Gpu` (what NVML says about each), decisions go out.

Lab addition: :func:`check` tells whether every selected GPU can hold its layout (the
profile exists on the GPU; compute slices, memory slices and the profile's instance count
suffice, by the shim's placement rules) before ``apply`` creates anything. mig-parted
clears the GPU and tries every ordering instead, so a layout that cannot fit leaves the
GPU without MIG devices; it fails at the same step.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from gpulab.errors import UserError

VERSION = "v1"
COMPUTE_SLICES, MEMORY_SLICES = 7, 8  # A100/H100; the shim's placement rules (fake-gpu/src/mig.c)

_FIELD = re.compile(r"^(\d+)(c|g|gb)$")
_ATTRIBUTE = re.compile(r"^[A-Za-z][A-Za-z0-9.]*[A-Za-z0-9]$|^[A-Za-z]$")


class MigConfigError(UserError, ValueError):
    """The config file, the selected config or the layout is unusable; one line why."""


# ---------------------------------------------------------------- MIG profile names


@dataclass(frozen=True)
class MigProfile:
    """go-nvlib's ``MigProfileInfo`` as far as names go."""

    c: int
    g: int
    gb: int
    attributes: tuple[str, ...] = ()
    neg_attributes: tuple[str, ...] = ()

    def __str__(self) -> str:
        suffix = ""
        if self.attributes:
            suffix = "+" + ",".join(self.attributes)
        if self.neg_attributes:
            suffix = "-" + ",".join(self.neg_attributes)
        head = f"{self.g}g.{self.gb}gb" if self.c == self.g else f"{self.c}c.{self.g}g.{self.gb}gb"
        return head + suffix


def _number(part: str, unit: str, profile: str) -> int:
    m = _FIELD.match(part)
    if m is None or m.group(2) != unit:
        raise MigConfigError(f"cannot parse fields of {profile!r}: malformed '%d{unit}'")
    return int(m.group(1))


def parse_profile(profile: str) -> MigProfile:
    """go-nvlib ``parseMigProfile`` (``AssertValidMigProfileFormat``)."""
    if not profile:
        raise MigConfigError("profile is the empty string")
    plus, minus = profile.split("+", 1), profile.split("-", 1)
    if len(plus) == 2 and len(minus) == 2:
        raise MigConfigError(f"profile {profile!r} contains both '+/-' attributes")
    split = plus if len(plus) == 2 else minus
    fields = split[0].split(".")
    if len(fields) == 3:
        c, g, gb = (_number(f, u, profile) for f, u in zip(fields, ("c", "g", "gb"), strict=True))
    elif len(fields) == 2:
        g, gb = _number(fields[0], "g", profile), _number(fields[1], "gb", profile)
        c = g
    else:
        raise MigConfigError(f"cannot parse fields of {profile!r}: expected 2 or 3 fields")
    attrs: tuple[str, ...] = ()
    if len(split) == 2:
        attrs = tuple(split[1].split(","))
        if len(set(attrs)) != len(attrs) or not all(_ATTRIBUTE.match(a) for a in attrs):
            raise MigConfigError(f"cannot parse attributes of {profile!r}")
    if split is minus and len(minus) == 2:
        return MigProfile(c, g, gb, neg_attributes=attrs)
    return MigProfile(c, g, gb, attributes=attrs)


# ---------------------------------------------------------------- the config file


@dataclass(frozen=True)
class MigConfigSpec:
    devices: str | tuple[int, ...]  # "all" or indexes
    mig_enabled: bool
    mig_devices: dict[str, int] = field(default_factory=dict)
    device_filter: tuple[str, ...] = ()

    def matches_device_filter(self, device_id: int, subsystem_id: int = 0) -> bool:
        """``MatchesDeviceFilter``: no filter matches every GPU; a filter entry is
        ``0x<device><vendor>`` (and optionally ``:0x<subdevice><subvendor>``)."""
        if not self.device_filter:
            return True
        for entry in self.device_filter:
            primary, _, sub = entry.partition(":")
            if int(primary, 0) == device_id and (not sub or int(sub, 0) == subsystem_id):
                return True
        return False

    def matches_devices(self, index: int) -> bool:
        return self.devices == "all" or index in self.devices


@dataclass(frozen=True)
class Spec:
    version: str
    mig_configs: dict[str, tuple[MigConfigSpec, ...]]


def _config_spec(raw: Any, where: str) -> MigConfigSpec:
    if not isinstance(raw, Mapping):
        raise MigConfigError(f"{where}: each entry must be a mapping")
    for key in ("devices", "mig-enabled"):
        if key not in raw:
            raise MigConfigError(f"{where}: missing required field: {key}")
    unknown = sorted(set(raw) - {"devices", "mig-enabled", "mig-devices", "device-filter"})
    if unknown:
        raise MigConfigError(f"{where}: unexpected field: {unknown[0]}")
    devices = raw["devices"]
    if isinstance(devices, str):
        if devices != "all":
            raise MigConfigError(f"{where}: invalid string input for 'devices': {devices}")
        parsed: str | tuple[int, ...] = "all"
    elif isinstance(devices, list) and all(isinstance(d, int) for d in devices):
        parsed = tuple(devices)
    else:
        raise MigConfigError(f"{where}: 'devices' must be \"all\" or a list of GPU indexes")
    enabled = raw["mig-enabled"]
    if not isinstance(enabled, bool):
        raise MigConfigError(f"{where}: 'mig-enabled' must be true or false")
    filt = raw.get("device-filter")
    if isinstance(filt, str):
        filters: tuple[str, ...] = (filt,) if filt else ()
    elif isinstance(filt, list) and all(isinstance(f, str) for f in filt):
        filters = tuple(filt)
    elif filt is None:
        filters = ()
    else:
        raise MigConfigError(f"{where}: 'device-filter' must be a string or a list of strings")
    for f in filters:
        try:
            for part in f.split(":"):
                int(part, 0)
        except ValueError:
            raise MigConfigError(f"{where}: invalid device-filter {f!r}") from None
    mig_devices = raw.get("mig-devices")
    if enabled and mig_devices is None:
        raise MigConfigError(
            f"{where}: missing required field 'mig-devices' when 'mig-enabled' is true"
        )
    mig_devices = mig_devices or {}
    if not isinstance(mig_devices, Mapping):
        raise MigConfigError(f"{where}: 'mig-devices' must map MIG profiles to counts")
    if not enabled and mig_devices:
        raise MigConfigError(f"{where}: MIG devices included when 'mig-enabled' is false")
    counts: dict[str, int] = {}
    for profile, count in mig_devices.items():
        parse_profile(str(profile))
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise MigConfigError(f"{where}: invalid count for {profile!r}: {count!r}")
        counts[str(profile)] = count
    if counts and not any(counts.values()):
        raise MigConfigError(f"{where}: all counts for all MigProfiles are 0")
    return MigConfigSpec(parsed, enabled, counts, filters)


def parse_spec(text: str) -> Spec:
    """``yaml.Unmarshal`` into ``v1.Spec`` with its checks; raises MigConfigError."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise MigConfigError(f"unmarshal error: not valid YAML{at}") from None
    if not isinstance(raw, Mapping):
        raise MigConfigError(
            "unmarshal error: the config must be a mapping with version and mig-configs"
        )
    if "version" not in raw and raw:
        raise MigConfigError("unable to parse with missing 'version' field")
    if raw.get("version") != VERSION:
        raise MigConfigError(f"unknown version: {raw.get('version')}")
    unknown = sorted(set(raw) - {"version", "mig-configs"})
    if unknown:
        raise MigConfigError(f"unexpected field: {unknown[0]}")
    configs = raw.get("mig-configs")
    if not isinstance(configs, Mapping) or not configs:
        raise MigConfigError("at least one entry in 'mig-configs' is required")
    out: dict[str, tuple[MigConfigSpec, ...]] = {}
    for name, entries in configs.items():
        if not isinstance(entries, list) or not entries:
            raise MigConfigError(f"at least one entry in {name!r} is required")
        out[str(name)] = tuple(
            _config_spec(e, f"mig-configs.{name}[{i}]") for i, e in enumerate(entries)
        )
    return Spec(VERSION, out)


def select(spec: Spec, name: str) -> tuple[MigConfigSpec, ...]:
    """``GetSelectedMigConfig``."""
    if name not in spec.mig_configs:
        raise MigConfigError(f"selected mig-config not present: {name}")
    return spec.mig_configs[name]


# ---------------------------------------------------------------- GPUs and layouts


@dataclass(frozen=True)
class GiProfile:
    """A GPU-instance profile of a GPU (``nvmlDeviceGetGpuInstanceProfileInfo``)."""

    name: str  # "1g.10gb"
    gi_id: int  # the GI profile ID to create instances with (15 ...)
    slices: int
    memory_mib: int
    instances: int


@dataclass(frozen=True)
class Gpu:
    """What NVML says about one GPU."""

    index: int
    name: str
    device_id: int  # (device << 16) | vendor
    mig_capable: bool
    mig_enabled: bool = False
    memory_mib: int = 0
    profiles: dict[str, GiProfile] = field(default_factory=dict)
    current: dict[str, int] = field(default_factory=dict)  # MIG devices by profile name


@dataclass(frozen=True)
class Target:
    """A GPU's wanted MIG mode and devices."""

    mig_enabled: bool
    devices: dict[str, int]
    all_devices: bool = True  # selected by `devices: all` (not by index)


def layout(specs: Sequence[MigConfigSpec], gpus: Iterable[Gpu]) -> dict[int, Target]:
    """``WalkSelectedMigConfigForEachGPU``: each entry applies to the GPUs its filter and
    devices select, in order; GPUs no entry selects are left alone."""
    out: dict[int, Target] = {}
    gpus = list(gpus)
    for spec in specs:
        for gpu in gpus:
            if spec.matches_device_filter(gpu.device_id) and spec.matches_devices(gpu.index):
                wanted = {k: v for k, v in spec.mig_devices.items() if v}
                out[gpu.index] = Target(spec.mig_enabled, wanted, spec.devices == "all")
    return out


def flatten(devices: Mapping[str, int]) -> list[str]:
    """``MigConfig.Flatten``: one entry per MIG device, largest (g, then c, then gb) first."""
    items = [(parse_profile(k), k) for k, v in devices.items() for _ in range(v)]
    items.sort(key=lambda p: (-p[0].g, -p[0].c, -p[0].gb, p[1]))
    return [name for _, name in items]


def _memory_slices(profile: GiProfile, gpu: Gpu) -> int:
    return max(1, min(MEMORY_SLICES, round(profile.memory_mib * MEMORY_SLICES / gpu.memory_mib)))


def check(targets: Mapping[int, Target], gpus: Iterable[Gpu]) -> list[str]:
    """Why a GPU cannot take its target (empty: every one can). Lab addition."""
    problems = []
    for gpu in gpus:
        target = targets.get(gpu.index)
        if target is None:
            continue
        where = f"GPU {gpu.index} ({gpu.name})"
        if not gpu.mig_capable:  # skipped when selected by `all`, as ApplyMigConfig does
            if target.mig_enabled and not target.all_devices:
                problems.append(f"{where} is not MIG capable")
            continue
        compute = memory = 0
        for name, count in sorted(target.devices.items()):
            profile = gpu.profiles.get(name)
            if profile is None:
                known = ", ".join(sorted(gpu.profiles)) or "none"
                problems.append(f"{where} has no MIG profile {name} (it has: {known})")
                break
            if count > profile.instances:
                problems.append(f"{where} holds at most {profile.instances} x {name}, not {count}")
                break
            compute += profile.slices * count
            memory += _memory_slices(profile, gpu) * count
        else:
            asked = " + ".join(f"{v}x {k}" for k, v in sorted(target.devices.items()))
            if compute > COMPUTE_SLICES:
                problems.append(
                    f"{where} cannot hold {asked}: {compute} compute slices > {COMPUTE_SLICES}"
                )
            elif memory > MEMORY_SLICES:
                problems.append(
                    f"{where} cannot hold {asked}: {memory} memory slices > {MEMORY_SLICES}"
                )
    return problems


def mode_applied(targets: Mapping[int, Target], gpus: Iterable[Gpu]) -> bool:
    """``assert --mode-only``: every selected MIG-capable GPU is in the wanted MIG mode."""
    return all(
        gpu.mig_enabled == targets[gpu.index].mig_enabled
        for gpu in gpus
        if gpu.index in targets and gpu.mig_capable
    )


def config_applied(targets: Mapping[int, Target], gpus: Iterable[Gpu]) -> bool:
    """``assert``: the mode, and on MIG-enabled GPUs exactly the wanted MIG devices."""
    gpus = list(gpus)
    if not mode_applied(targets, gpus):
        return False
    return all(
        Counter(gpu.current) == Counter(targets[gpu.index].devices)
        for gpu in gpus
        if gpu.index in targets and gpu.mig_capable and targets[gpu.index].mig_enabled
    )


# ---------------------------------------------------------------- the config from the hardware


class NoMigCapableGpuError(MigConfigError):
    """``discoverProfiles``: no GPU of the node is MIG-capable."""


class NoProfilesDiscoveredError(MigConfigError):
    """``discovery.ErrNoProfilesDiscovered``: MIG-capable GPUs, but NVML listed no profile
    (older drivers with MIG disabled): the MIG manager falls back to DEFAULT_CONFIG_FILE."""


GENERATED_HEADER = (
    "# DO NOT EDIT: Auto-generated MIG configuration from GPU hardware.\n"
    '# Generated by "nvidia-mig-manager".\n'
)
_BALANCED = {7: {1: 2, 2: 1, 3: 1}, 4: {1: 2, 2: 1}}  # balancedFormula: slots -> {g: count}


def device_id_string(device_id: int) -> str:
    """``types.DeviceID.String``: ``0x<device><vendor>`` in upper-case hex."""
    return f"0x{device_id:08X}"


def discover(gpus: Sequence[Gpu]) -> dict[int, list[GiProfile]]:
    """``discoverProfiles``: each MIG-capable GPU's GPU-instance profiles (a profile's
    ``instances`` is its maximum count)."""
    capable = [g for g in gpus if g.mig_capable]
    if not capable:
        raise NoMigCapableGpuError("no MIG-capable devices found on the system")
    found = {g.index: list(g.profiles.values()) for g in capable if g.profiles}
    if not found:
        raise NoProfilesDiscoveredError("no MIG profiles discovered for MIG-capable GPUs")
    return found


def _balanced(by_gpu: Mapping[int, Sequence[GiProfile]], ids: Mapping[int, str]) -> list[Any]:
    """``buildAllBalancedConfig``: per kind of GPU, 2 x 1g + 1 x 2g (+ 1 x 3g on a
    7-slice GPU), each the base profile of most instances (1g.5gb before 1g.10gb)."""
    sets: dict[str, tuple[int, dict[int, GiProfile]]] = {}
    for index, profiles in by_gpu.items():
        slots, chosen = sets.get(ids[index], (0, {}))
        for profile in profiles:
            parsed = parse_profile(profile.name)
            if parsed.attributes or parsed.neg_attributes:
                continue
            slots = max(slots, parsed.g)
            best = chosen.get(parsed.g)
            if 1 <= parsed.g <= 3 and (best is None or profile.instances > best.instances):
                chosen[parsed.g] = profile
        sets[ids[index]] = (slots, chosen)
    out = []
    for device_id in sorted(sets):
        slots, chosen = sets[device_id]
        formula = _BALANCED.get(slots)
        if formula is None or any(g not in chosen for g in formula):
            continue  # "missing required profiles for all-balanced config, skipping"
        row: dict[str, Any] = {"devices": "all", "mig-enabled": True}
        row["mig-devices"] = {chosen[g].name: n for g, n in sorted(formula.items())}
        out.append((device_id, row))
    return out


def build_config(gpus: Sequence[Gpu]) -> dict[str, Any]:
    """``buildMigConfigSpec`` over :func:`discover`: the spec as a document."""
    by_gpu = discover(gpus)
    ids = {g.index: device_id_string(g.device_id) for g in gpus if g.index in by_gpu}
    several = len(set(ids.values())) > 1
    configs: dict[str, list[dict[str, Any]]] = {
        "all-disabled": [{"devices": "all", "mig-enabled": False, "mig-devices": {}}],
        "all-enabled": [{"devices": "all", "mig-enabled": True, "mig-devices": {}}],
    }
    balanced = _balanced(by_gpu, ids)
    if balanced:
        configs["all-balanced"] = [
            {"device-filter": [device_id], **row} if several else row for device_id, row in balanced
        ]
    groups: dict[str, dict[str, int]] = {}  # profile -> {device ID: max count}
    for index, profiles in by_gpu.items():
        for profile in profiles:
            groups.setdefault(profile.name, {})[ids[index]] = profile.instances
    for name in sorted(groups):
        by_count: dict[int, list[str]] = {}
        for device_id, count in groups[name].items():
            by_count.setdefault(count, []).append(device_id)
        rows = []
        for count in sorted(by_count):
            row: dict[str, Any] = {"devices": "all", "mig-enabled": True}
            row["mig-devices"] = {name: count}
            rows.append({"device-filter": sorted(by_count[count]), **row} if several else row)
        configs[f"all-{name.replace('+', '.')}"] = rows
    return {"version": VERSION, "mig-configs": dict(sorted(configs.items(), key=_natural))}


def _natural(item: tuple[str, Any]) -> list[Any]:
    """yaml.v2's key order: runs of digits compare as numbers (all-1g.5gb < all-1g.10gb)."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.findall(r"\d+|\D+", item[0])]


class _FlowFilters(yaml.SafeDumper):
    """The spec's ``device-filter,flow`` tag: device filters as one flow sequence."""


_FlowFilters.add_representer(
    tuple, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True)
)


def config_yaml(spec: Mapping[str, Any]) -> str:
    """``GenerateConfigYAML`` and the header ``writeGeneratedConfig`` puts on it."""
    doc = {
        "version": spec["version"],
        "mig-configs": {
            name: [
                {k: tuple(v) if k == "device-filter" else v for k, v in row.items()} for row in rows
            ]
            for name, rows in spec["mig-configs"].items()
        },
    }
    return GENERATED_HEADER + yaml.dump(doc, Dumper=_FlowFilters, sort_keys=False)
