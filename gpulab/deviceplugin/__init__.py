"""NVIDIA device plugin (kubelet device-plugin API v1beta1), reading GPUs through NVML."""
