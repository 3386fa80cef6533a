"""The scheduler plugins by name (volcano-sh/volcano v1.15.1 ``plugins/factory.go``)."""

from __future__ import annotations

from gpulab.volcano.scheduler.framework.interface import PluginBuilder
from gpulab.volcano.scheduler.plugins.binpack import BinpackPlugin
from gpulab.volcano.scheduler.plugins.conformance import ConformancePlugin
from gpulab.volcano.scheduler.plugins.drf import DrfPlugin
from gpulab.volcano.scheduler.plugins.gang import GangPlugin
from gpulab.volcano.scheduler.plugins.nodeorder import NodeOrderPlugin
from gpulab.volcano.scheduler.plugins.overcommit import OvercommitPlugin
from gpulab.volcano.scheduler.plugins.predicates import PredicatesPlugin
from gpulab.volcano.scheduler.plugins.priority import PriorityPlugin
from gpulab.volcano.scheduler.plugins.proportion import ProportionPlugin

PLUGINS: dict[str, PluginBuilder] = {
    "binpack": BinpackPlugin,
    "conformance": ConformancePlugin,
    "drf": DrfPlugin,
    "gang": GangPlugin,
    "nodeorder": NodeOrderPlugin,
    "overcommit": OvercommitPlugin,
    "predicates": PredicatesPlugin,
    "priority": PriorityPlugin,
    "proportion": ProportionPlugin,
}
