"""HAMi in Python: the vGPU scheduler extender + webhook and the HAMi device-plugin side.

Mirrors Project-HAMi/HAMi v2.10.0 (``cmd/scheduler``, ``pkg/scheduler``,
``pkg/device/nvidia``, ``pkg/device``, ``pkg/util/nodelock``); docs/hami.md walks the call
chain and lists every deliberate difference.
"""
