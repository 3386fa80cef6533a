"""The vcjob controller (volcano-sh/volcano v1.15.1 ``pkg/controllers/job``)."""
