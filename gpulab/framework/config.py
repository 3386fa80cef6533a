"""The scheduler's profile file: a KubeSchedulerConfiguration, as kube-scheduler reads it.

Mirrors kubernetes v1.36.3 ``pkg/scheduler/apis/config/v1`` (``kubescheduler.config.k8s.io/v1``
``KubeSchedulerConfiguration``; ``default_plugins.go``: the default plugins enabled as
``multiPoint`` and ``mergePlugins``/``mergePluginSet``, which lay a profile's
``enabled``/``disabled`` lists over them) - so a profile written for kube-scheduler or for
scheduler-plugins' kube-scheduler reads the same here::

    apiVersion: kubescheduler.config.k8s.io/v1
    kind: KubeSchedulerConfiguration
    profiles:
    - schedulerName: gpulab-scheduler
      plugins:
        multiPoint:
          enabled: [{name: Coscheduling}]
          disabled: [{name: PrioritySort}]
      pluginConfig:
      - name: Coscheduling
        args: {permitWaitingTimeSeconds: 10}

Lab differences: the default plugin set is the in-tree subset the lab implements, in
upstream's order and with its weights (SchedulingGates, PrioritySort, NodeUnschedulable,
NodeName, TaintToleration 3, NodeAffinity 2, NodeResourcesFit 1, PodTopologySpread 2,
NodeResourcesBalancedAllocation 1, ImageLocality 1, DefaultBinder - not NodePorts, the
volume plugins, InterPodAffinity, DefaultPreemption, DynamicResources or
NodeDeclaredFeatures); ``extenders`` are refused; ``leaderElection`` and
``parallelism`` are read but have no effect (one replica, one scheduling thread).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpulab.errors import UserError

API_VERSION = "kubescheduler.config.k8s.io/v1"
KIND = "KubeSchedulerConfiguration"
MULTI_POINT = "multiPoint"
EXTENSION_POINT_KEYS = (
    "preEnqueue",
    "queueSort",
    "preFilter",
    "filter",
    "postFilter",
    "preScore",
    "score",
    "reserve",
    "permit",
    "preBind",
    "bind",
    "postBind",
)
_TOP_LEVEL = {
    "apiVersion",
    "kind",
    "parallelism",
    "leaderElection",
    "clientConnection",
    "healthzBindAddress",
    "metricsBindAddress",
    "debuggingConfiguration",
    "percentageOfNodesToScore",
    "podInitialBackoffSeconds",
    "podMaxBackoffSeconds",
    "profiles",
    "extenders",
    "delayCacheUntilActive",
}
_PROFILE_KEYS = {"schedulerName", "plugins", "pluginConfig", "percentageOfNodesToScore"}
DEFAULT_SCHEDULER_NAME = "default-scheduler"


class ConfigError(UserError):
    """The profile file is wrong; the message names the field and what to write."""


@dataclass(frozen=True)
class PluginRef:
    name: str
    weight: int = 0


@dataclass
class PluginSet:
    enabled: list[PluginRef] = field(default_factory=list)
    disabled: list[str] = field(default_factory=list)


@dataclass
class Profile:
    scheduler_name: str
    # "multiPoint" and each extension point -> the merged PluginSet
    plugins: dict[str, PluginSet]
    plugin_config: dict[str, dict[str, Any]]
    percentage_of_nodes_to_score: int | None = None


@dataclass
class SchedulerConfiguration:
    profiles: list[Profile]
    pod_initial_backoff_seconds: float = 1.0
    pod_max_backoff_seconds: float = 10.0
    percentage_of_nodes_to_score: int | None = None
    kubeconfig: str | None = None


def default_plugins() -> dict[str, PluginSet]:
    """getDefaultPlugins(), restricted to the plugins the lab implements (same weights)."""
    return {
        MULTI_POINT: PluginSet(
            enabled=[
                PluginRef("SchedulingGates"),
                PluginRef("PrioritySort"),
                PluginRef("NodeUnschedulable"),
                PluginRef("NodeName"),
                PluginRef("TaintToleration", 3),
                PluginRef("NodeAffinity", 2),
                PluginRef("NodeResourcesFit", 1),
                PluginRef("PodTopologySpread", 2),
                PluginRef("NodeResourcesBalancedAllocation", 1),
                PluginRef("ImageLocality", 1),
                PluginRef("DefaultBinder"),
            ]
        )
    }


def merge_plugin_set(default: PluginSet, custom: PluginSet) -> PluginSet:
    """mergePluginSet: defaults minus the disabled ones ("*": all), a re-configured
    default keeps its place, other custom plugins follow."""
    disabled = [*custom.disabled, *default.disabled]
    custom_by_name = {p.name: i for i, p in enumerate(custom.enabled)}
    replaced: set[int] = set()
    enabled: list[PluginRef] = []
    if "*" not in disabled:
        for plugin in default.enabled:
            if plugin.name in disabled:
                continue
            if plugin.name in custom_by_name:
                index = custom_by_name[plugin.name]
                plugin = custom.enabled[index]
                replaced.add(index)
            enabled.append(plugin)
    enabled += [p for i, p in enumerate(custom.enabled) if i not in replaced]
    return PluginSet(enabled, disabled)


def merge_plugins(custom: Mapping[str, PluginSet]) -> dict[str, PluginSet]:
    defaults = default_plugins()
    return {
        key: merge_plugin_set(defaults.get(key, PluginSet()), custom.get(key, PluginSet()))
        for key in (MULTI_POINT, *EXTENSION_POINT_KEYS)
    }


def load(path: str | Path) -> SchedulerConfiguration:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read scheduler config {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc.__class__.__name__}); fix it") from exc
    try:
        return parse(data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def parse(data: Any) -> SchedulerConfiguration:
    if not isinstance(data, dict):
        raise ConfigError(f"must be a {KIND} mapping")
    if data.get("apiVersion") != API_VERSION or data.get("kind") != KIND:
        raise ConfigError(
            f"apiVersion/kind must be {API_VERSION} {KIND}, got "
            f"{data.get('apiVersion')} {data.get('kind')}"
        )
    unknown = set(data) - _TOP_LEVEL
    if unknown:
        raise ConfigError(f"unknown field(s) {sorted(unknown)}; known: {sorted(_TOP_LEVEL)}")
    if data.get("extenders"):
        raise ConfigError("extenders are not supported by gpulab-scheduler; remove them")
    raw_profiles = data.get("profiles") or [{"schedulerName": DEFAULT_SCHEDULER_NAME}]
    if not isinstance(raw_profiles, list):
        raise ConfigError("profiles must be a list")
    profiles = [_parse_profile(p, i) for i, p in enumerate(raw_profiles)]
    names = [p.scheduler_name for p in profiles]
    if len(set(names)) != len(names):
        raise ConfigError(f"profiles: duplicate schedulerName in {names}")
    initial = _number(data, "podInitialBackoffSeconds", 1)
    maximum = _number(data, "podMaxBackoffSeconds", 10)
    if maximum < initial:
        raise ConfigError("podMaxBackoffSeconds must not be smaller than podInitialBackoffSeconds")
    return SchedulerConfiguration(
        profiles=profiles,
        pod_initial_backoff_seconds=initial,
        pod_max_backoff_seconds=maximum,
        percentage_of_nodes_to_score=data.get("percentageOfNodesToScore"),
        kubeconfig=(data.get("clientConnection") or {}).get("kubeconfig") or None,
    )


def _number(data: Mapping[str, Any], key: str, default: float) -> float:
    value = data.get(key, default)
    if not isinstance(value, int | float) or value < 0:
        raise ConfigError(f"{key} must be a number >= 0, got {value!r}")
    return float(value)


def _parse_profile(raw: Any, i: int) -> Profile:
    where = f"profiles[{i}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping")
    unknown = set(raw) - _PROFILE_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {sorted(unknown)}")
    name = raw.get("schedulerName") or DEFAULT_SCHEDULER_NAME
    plugins_raw = raw.get("plugins") or {}
    if not isinstance(plugins_raw, dict):
        raise ConfigError(f"{where}.plugins must be a mapping of extension points")
    bad = set(plugins_raw) - {MULTI_POINT, *EXTENSION_POINT_KEYS}
    if bad:
        raise ConfigError(
            f"{where}.plugins: unknown extension point(s) {sorted(bad)}; "
            f"known: {MULTI_POINT}, {', '.join(EXTENSION_POINT_KEYS)}"
        )
    custom = {
        key: _parse_plugin_set(value, f"{where}.plugins.{key}")
        for key, value in plugins_raw.items()
    }
    config: dict[str, dict[str, Any]] = {}
    for j, entry in enumerate(raw.get("pluginConfig") or []):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ConfigError(f"{where}.pluginConfig[{j}] needs a name")
        if entry["name"] in config:
            raise ConfigError(f"{where}.pluginConfig: {entry['name']} is configured twice")
        args = entry.get("args") or {}
        if not isinstance(args, dict):
            raise ConfigError(f"{where}.pluginConfig[{j}].args must be a mapping")
        config[entry["name"]] = args
    return Profile(name, merge_plugins(custom), config, raw.get("percentageOfNodesToScore"))


def _parse_plugin_set(raw: Any, where: str) -> PluginSet:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping with enabled/disabled lists")
    out = PluginSet()
    for key in ("enabled", "disabled"):
        for k, item in enumerate(raw.get(key) or []):
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise ConfigError(f"{where}.{key}[{k}] must be {{name: PluginName}}")
            if key == "enabled":
                weight = item.get("weight", 0)
                if not isinstance(weight, int) or weight < 0:
                    raise ConfigError(f"{where}.{key}[{k}].weight must be an integer >= 0")
                out.enabled.append(PluginRef(item["name"], weight))
            else:
                out.disabled.append(item["name"])
    return out
