"""kubernetes-sigs/scheduler-plugins, the parts the lab needs, on gpulab/framework.

Mirrors scheduler-plugins **v0.35.4-devel** (commit 2c75c8b5, built against Kubernetes
v1.35.4; its Coscheduling and NodeResourceTopology code is the same as release v0.34.7's
apart from import paths):

    apis.py                   apis/scheduling/v1alpha1 (PodGroup, the pod-group label)
    coscheduling/             pkg/coscheduling (coscheduling.go, core/core.go)
    noderesourcetopology/     pkg/noderesourcetopology (filter.go, score.go,
                              least_numa.go, numaresources.go, plugin.go, caches)
    controllers/podgroup.py   pkg/controllers/podgroup_controller.go
    commands.py               cmd/scheduler (gpulab scheduler), cmd/controller
                              (gpulab podgroup-controller)

docs/scheduling-framework.md lists every deliberate difference from upstream.
"""
