"""The scheduler's configuration: the device config file and Go-style flag values.

Mirrors Project-HAMi/HAMi v2.10.0 ``pkg/scheduler/config/config.go`` (``LoadConfig``, the
``nvidia:`` section of ``--device-config-file``, which the chart renders into the
``hami-scheduler-device`` ConfigMap) and ``pkg/device/nvidia/device.go`` ``NvidiaConfig``.
v2.10 has no ``--default-mem`` / ``--default-cores`` / ``--default-gpu`` flags any more
(the seed chapter shows them, from older code): those defaults are ``defaultMemory``,
``defaultCores`` and ``defaultGPUNum`` in this file.

Also Go's ``time.ParseDuration`` and pflag's ``StringToString`` for the flags that take
them (``--node-lock-timeout 5m``, ``--node-label-selector a=b,c=d``). Pure.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from gpulab.errors import UserError
from gpulab.framework.runtime import go_duration

SCHEDULER_NAME = "hami-scheduler"


class ConfigError(UserError):
    """A flag value or the device config file is not usable; the message says which."""


@dataclass(frozen=True)
class MigAllowlist:
    """``AllowedMigProfiles``: the MIG profiles HAMi may create on GPUs whose model name
    contains one of ``models`` (the device plugin reads their sizes and placements from
    NVML; ``ValidateMigProfileAllowlist`` checks only the shape)."""

    models: tuple[str, ...]
    profiles: tuple[str, ...]


@dataclass(frozen=True)
class NvidiaConfig:
    """``NvidiaConfig``: resource names and the defaults the webhook and Filter apply, and
    the node defaults the device plugin reads from the same file."""

    resource_count_name: str = "nvidia.com/gpu"
    resource_memory_name: str = "nvidia.com/gpumem"
    resource_core_name: str = "nvidia.com/gpucores"
    resource_memory_percentage_name: str = "nvidia.com/gpumem-percentage"
    resource_priority: str = "nvidia.com/priority"
    overwrite_env: bool = False
    default_memory: int = 0
    default_cores: int = 0
    default_gpu_num: int = 1
    memory_factor: int = 1
    gpu_core_policy: str = "default"  # injected as GPU_CORE_UTILIZATION_POLICY unless default
    runtime_class_name: str = ""
    device_split_count: int = 10  # NodeDefaultConfig: shares advertised per GPU
    enable_numa_topology: bool = False  # NodeDefaultConfig: NUMA node on each share
    mig_profile_allowlist: tuple[MigAllowlist, ...] = ()


# YAML key (as the chart writes it) → NvidiaConfig field
_YAML_KEYS = {
    "resourceCountName": "resource_count_name",
    "resourceMemoryName": "resource_memory_name",
    "resourceCoreName": "resource_core_name",
    "resourceMemoryPercentageName": "resource_memory_percentage_name",
    "resourcePriorityName": "resource_priority",
    "overwriteEnv": "overwrite_env",
    "defaultMemory": "default_memory",
    "defaultCores": "default_cores",
    "defaultGPUNum": "default_gpu_num",
    "memoryFactor": "memory_factor",
    "gpuCorePolicy": "gpu_core_policy",
    "runtimeClassName": "runtime_class_name",
    "deviceSplitCount": "device_split_count",
    "enableNumaTopology": "enable_numa_topology",
}


def mig_allowlist(raw: Any, source: str) -> tuple[MigAllowlist, ...]:
    """``migProfileAllowlist`` and ``ValidateMigProfileAllowlist``: each entry names
    models and profiles, each profile ``<n>g.<memory>``."""
    where = f"{source}: nvidia.migProfileAllowlist"
    if not isinstance(raw, list):
        raise ConfigError(f"{where} must be a list of {{models, profiles}}")
    out = []
    for entry in raw:
        models = entry.get("models") if isinstance(entry, dict) else None
        profiles = entry.get("profiles") if isinstance(entry, dict) else None
        if not models or not profiles:
            raise ConfigError(f"{where}: MIG profile allowlist must define models and profiles")
        for profile in profiles:
            head, dot, _ = str(profile).partition(".")
            if not dot or len(head) < 2 or not head.endswith("g"):
                raise ConfigError(f"{where}: invalid MIG profile {profile!r}")
        out.append(MigAllowlist(tuple(map(str, models)), tuple(map(str, profiles))))
    return tuple(out)


def nvidia_config(data: Any, source: str) -> NvidiaConfig:
    """The ``nvidia:`` section of a device config; other vendors' sections are ignored
    (the lab schedules NVIDIA GPUs only), as are keys this lab does not use."""
    if not isinstance(data, dict) or not isinstance(data.get("nvidia"), dict):
        raise ConfigError(f"{source}: needs an 'nvidia:' section (see manifests/hami)")
    section = data["nvidia"]
    types = {f.name: f.type for f in fields(NvidiaConfig)}
    values: dict[str, Any] = {}
    for key, name in _YAML_KEYS.items():
        if key not in section or section[key] is None:
            continue
        value = section[key]
        want = {"bool": bool, "int": int, "str": str}[str(types[name])]
        if want is str and isinstance(value, str | int):
            value = str(value)
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            noun = {bool: "a boolean", int: "an integer", str: "a string"}[want]
            raise ConfigError(f"{source}: nvidia.{key} must be {noun}, got {value!r}")
        values[name] = value
    if values.get("gpu_core_policy", "default") in ("", "default"):
        values["gpu_core_policy"] = "default"
    if section.get("migProfileAllowlist") is not None:
        values["mig_profile_allowlist"] = mig_allowlist(section["migProfileAllowlist"], source)
    return NvidiaConfig(**values)


def load_device_config(path: str) -> NvidiaConfig:
    """``LoadConfig`` + ``InitDevicesWithConfig`` for NVIDIA."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"--device-config-file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"--device-config-file {path}: not YAML ({exc})") from exc
    return nvidia_config(data, f"--device-config-file {path}")


_DURATION_PART = re.compile(r"(\d*\.?\d*)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def parse_go_duration(value: str, flag: str) -> dt.timedelta:
    """Go's ``time.ParseDuration``: "5m", "1h30m", "300ms", "0"; a bare number other than 0
    has no unit and is an error, as in Go."""
    text = value.strip()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    if body == "0":
        return dt.timedelta(0)
    pos, seconds = 0, 0.0
    while pos < len(body):
        m = _DURATION_PART.match(body, pos)
        if not m or m.group(1) in ("", "."):
            hint = "missing unit" if re.fullmatch(r"[\d.]+", body) else "not a Go duration"
            raise ConfigError(
                f"{flag} {value!r}: {hint} (a Go duration such as 300ms, 28s, 5m or 1h30m)"
            )
        seconds += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    if not body:
        raise ConfigError(f"{flag} {value!r}: empty (a Go duration such as 28s or 5m)")
    return dt.timedelta(seconds=sign * seconds)


def go_duration_string(delta: dt.timedelta) -> str:
    """``time.Duration.String()``: "5m0s", "28s", "300ms" (the framework's formatter)."""
    return go_duration(delta.total_seconds())


def parse_string_to_string(value: str, flag: str) -> dict[str, str]:
    """pflag ``StringToString``: "a=b,c=d"."""
    out: dict[str, str] = {}
    if not value:
        return out
    for pair in value.split(","):
        key, sep, val = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} {value!r}: expected key=value pairs separated by commas")
        out[key] = val
    return out
