"""The scheduler configuration: ``actions`` and ``tiers`` of plugins, as the ConfigMap has it.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/conf/scheduler_conf.go``
(``SchedulerConfiguration`` {actions, tiers, configurations}, ``PluginOption`` with its
``enable*`` switches and ``arguments``), ``pkg/scheduler/util.go`` (``DefaultSchedulerConf``,
``UnmarshalSchedulerConf``: every switch defaults to true, ``drf`` with hierarchy and
``proportion`` conflict, an unknown action is an error), ``plugins/defaults.go``
(``ApplyPluginConfDefaults``) and ``framework/arguments.go`` (``GetInt``, ``GetBool``,
``GetFloat64``, ``GetArgOfActionFromConf``).

Lab difference: a plugin name this scheduler does not have is an error here too
("failed to find Plugin <name>"), so the scheduler keeps its last good configuration;
upstream accepts it and logs "Failed to get plugin <name>." at every session.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from gpulab.errors import UserError

# pkg/scheduler/util.go DefaultSchedulerConf
DEFAULT_SCHEDULER_CONF = """
actions: "enqueue, allocate, backfill"
tiers:
- plugins:
  - name: priority
  - name: gang
  - name: conformance
- plugins:
  - name: overcommit
  - name: drf
  - name: predicates
  - name: proportion
  - name: nodeorder
"""

# PluginOption yaml keys -> the switch each extension point checks
SWITCHES = (
    "enableJobOrder",
    "enableHierarchy",
    "enableJobReady",
    "enableJobPipelined",
    "enableTaskOrder",
    "enablePreemptable",
    "enableReclaimable",
    "enablePreemptive",
    "enableQueueOrder",
    "enablePredicate",
    "enableBestNode",
    "enableNodeOrder",
    "enableJobEnqueued",
    "enableJobStarving",
    "enabledOverused",
    "enabledAllocatable",
    "enabledVictim",
    "enableTargetJob",
    "enableReservedNodes",
)


class ConfError(UserError):
    """The scheduler configuration is invalid; the message names what and where."""


class Arguments(dict[str, Any]):
    """framework.Arguments: a plugin's (or action's) ``arguments`` map."""

    def get_int(self, key: str, default: int) -> int:
        value = self.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    def get_float(self, key: str, default: float) -> float:
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return default
        return float(value)

    def get_bool(self, key: str, default: bool) -> bool:
        value = self.get(key)
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "t", "true", "0", "f", "false"):
            return value.lower() in ("1", "t", "true")
        return default


@dataclass(frozen=True)
class PluginOption:
    name: str
    switches: Mapping[str, bool] = field(default_factory=dict)
    arguments: Arguments = field(default_factory=Arguments)

    def enabled(self, switch: str) -> bool:
        """isEnabled after ApplyPluginConfDefaults: unset means on (hierarchy: off)."""
        return self.switches.get(switch, switch != "enableHierarchy")


@dataclass(frozen=True)
class Tier:
    plugins: tuple[PluginOption, ...]


@dataclass(frozen=True)
class SchedulerConfiguration:
    actions: tuple[str, ...]
    tiers: tuple[Tier, ...]
    configurations: Mapping[str, Arguments] = field(default_factory=dict)

    def plugin_names(self) -> list[str]:
        return [p.name for t in self.tiers for p in t.plugins]

    def action_arguments(self, action: str) -> Arguments:
        """GetArgOfActionFromConf."""
        return self.configurations.get(action, Arguments())


def unmarshal_scheduler_conf(
    text: str, known_actions: Iterable[str], known_plugins: Iterable[str]
) -> SchedulerConfiguration:
    """UnmarshalSchedulerConf: parse and check a configuration; raise ConfError."""
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfError(f"not YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfError("expected a mapping with `actions` and `tiers`")
    actions = tuple(a.strip() for a in str(doc.get("actions") or "").split(","))
    known_actions, known_plugins = set(known_actions), set(known_plugins)
    for action in actions:
        if action not in known_actions:
            known = ", ".join(sorted(known_actions))
            raise ConfError(f"failed to find Action {action!r}; known actions: {known}")
    tiers: list[Tier] = []
    for i, raw_tier in enumerate(doc.get("tiers") or []):
        options: list[PluginOption] = []
        hdrf = proportion = False
        for raw in (raw_tier or {}).get("plugins") or []:
            name = str((raw or {}).get("name") or "")
            if name not in known_plugins:
                raise ConfError(
                    f"tiers[{i}]: failed to find Plugin {name!r}; known plugins: "
                    f"{', '.join(sorted(known_plugins))}"
                )
            switches = {k: bool(raw[k]) for k in SWITCHES if raw.get(k) is not None}
            option = PluginOption(name, switches, Arguments(raw.get("arguments") or {}))
            hdrf |= name == "drf" and option.enabled("enableHierarchy")
            proportion |= name == "proportion"
            options.append(option)
        if hdrf and proportion:
            raise ConfError("proportion and drf with hierarchy enabled conflicts")
        tiers.append(Tier(tuple(options)))
    configurations = {
        str(c.get("name")): Arguments(c.get("arguments") or {})
        for c in doc.get("configurations") or []
        if isinstance(c, dict)
    }
    return SchedulerConfiguration(actions, tuple(tiers), configurations)
