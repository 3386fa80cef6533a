"""HAMi in Python: the vGPU scheduler extender + webhook and the HAMi device-plugin side.

Mirrors Project-HAMi/HAMi: ``cmd/scheduler``, ``pkg/scheduler``, ``pkg/device/nvidia``,
``pkg/util/nodelock``.
"""
