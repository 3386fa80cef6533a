"""vc-controller-manager's controllers (volcano-sh/volcano v1.15.1 ``pkg/controllers``)."""
