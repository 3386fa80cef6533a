"""Errors the harness reports as one line: what is wrong and what to do."""


class HarnessError(RuntimeError):
    pass
