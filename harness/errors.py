"""Errors the harness reports as one line: what is wrong and what to do."""

from gpulab.errors import UserError


class HarnessError(UserError, RuntimeError):
    pass
