"""The in-tree plugins the lab implements, registered by name (cf. kubernetes v1.36.3
``pkg/scheduler/framework/plugins/registry.go`` ``NewInTreeRegistry``)."""

from __future__ import annotations

from gpulab.framework.plugins import (
    balancedallocation,
    defaultbinder,
    imagelocality,
    nodeaffinity,
    nodename,
    noderesources,
    nodeunschedulable,
    podtopologyspread,
    queuesort,
    schedulinggates,
    tainttoleration,
)
from gpulab.framework.runtime import Registry


def in_tree_registry() -> Registry:
    return {
        schedulinggates.NAME: schedulinggates.new,
        queuesort.NAME: queuesort.new,
        nodeunschedulable.NAME: nodeunschedulable.new,
        nodename.NAME: nodename.new,
        tainttoleration.NAME: tainttoleration.new,
        nodeaffinity.NAME: nodeaffinity.new,
        noderesources.NAME: noderesources.new,
        podtopologyspread.NAME: podtopologyspread.new,
        balancedallocation.NAME: balancedallocation.new,
        imagelocality.NAME: imagelocality.new,
        defaultbinder.NAME: defaultbinder.new,
    }
