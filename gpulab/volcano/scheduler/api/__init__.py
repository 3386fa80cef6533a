"""Volcano's scheduler API types (volcano-sh/volcano v1.15.1 ``pkg/scheduler/api``)."""
