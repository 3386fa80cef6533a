"""The GPU Operator chapter: the lab's counterpart of NVIDIA gpu-operator v26.7.0.

Pinned releases (docs/gpu-operator.md has the call chain and every deliberate difference):

- NVIDIA/gpu-operator v26.7.0 (commit 10ee5b3): the ClusterPolicy CRD, the state walk of
  ``controllers/clusterpolicy_controller.go`` and ``state_manager.go``, node labelling of
  ``nodelabeling_controller.go``, the object controls of ``object_controls.go``, the
  ``assets/state-*`` operands and ``cmd/nvidia-validator``;
- NVIDIA/mig-parted v0.15.0 (the k8s-mig-manager image the operator's Helm values name):
  the config format (``api/spec/v1``), ``cmd/nvidia-mig-manager`` and the reconfigure flow
  of ``pkg/mig/reconfigure``;
- NVIDIA/dcgm-exporter 4.5.3-4.8.2: the default counters (``etc/default-counters.csv``)
  and the metric format (``internal/pkg/rendermetrics``);
- the device plugin and GFD are the lab's k8s-device-plugin v0.20.0 (gpulab/deviceplugin).

Modules: ``api`` (ClusterPolicy), ``nodelabels`` (GPU node labels, pure), ``states`` (the
state walk, pure), ``render`` (assets → objects, pure), ``controls`` (apply/delete/ready
per object kind), ``controller`` (the reconcilers and their manager), ``validator``,
``gfd``, ``dcgm``, ``migparted`` (pure), ``migmanager``, ``commands`` (the CLI).
"""
