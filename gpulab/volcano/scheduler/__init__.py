"""vc-scheduler (volcano-sh/volcano v1.15.1 ``pkg/scheduler``): one Session per period."""
