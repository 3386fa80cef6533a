"""Kubelet's device manager for simulated nodes (the local backend's node agent).

Mirrors kubelet v1.36.3 ``pkg/kubelet/cm/devicemanager`` (table: docs/device-plugin.md).
"""
