"""kubernetes-sigs/scheduler-plugins, the parts the lab needs, on gpulab/framework.

Mirrors scheduler-plugins **v0.35.4-devel** (commit 2c75c8b5, built against Kubernetes
v1.35.4; its Coscheduling and NodeResourceTopology code is the same as release v0.34.7's
apart from import paths):

    commands.py            cmd/scheduler/main.go (kube-scheduler with the plugins
                           registered) and cmd/controller (the PodGroup controller)
"""
