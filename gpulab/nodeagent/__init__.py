"""Kubelet's device manager for simulated nodes (the local backend's node agent)."""
