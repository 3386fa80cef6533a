"""Volcano's scheduling framework (volcano-sh/volcano v1.15.1 ``pkg/scheduler/framework``)."""
