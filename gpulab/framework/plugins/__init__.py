"""The in-tree plugins the lab implements, registered by name (cf. kubernetes v1.36.3
``pkg/scheduler/framework/plugins/registry.go`` ``NewInTreeRegistry``)."""

from __future__ import annotations

from gpulab.framework.plugins import (
    defaultbinder,
    nodeaffinity,
    nodename,
    noderesources,
    nodeunschedulable,
    queuesort,
    tainttoleration,
)
from gpulab.framework.runtime import Registry


def in_tree_registry() -> Registry:
    return {
        queuesort.NAME: queuesort.new,
        nodeunschedulable.NAME: nodeunschedulable.new,
        nodename.NAME: nodename.new,
        tainttoleration.NAME: tainttoleration.new,
        nodeaffinity.NAME: nodeaffinity.new,
        noderesources.NAME: noderesources.new,
        defaultbinder.NAME: defaultbinder.new,
    }
