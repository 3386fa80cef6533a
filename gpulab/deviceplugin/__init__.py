"""NVIDIA device plugin (kubelet device-plugin API v1beta1), reading GPUs through NVML.

Mirrors NVIDIA/k8s-device-plugin v0.20.0 with go-gpuallocator v0.6.0; each module names the
upstream files it follows and where it differs (table: docs/device-plugin.md).
"""
