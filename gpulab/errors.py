"""The one base class for errors a user can act on.

The CLI prints any :class:`UserError` as one line (``gpulab: error: ...``) and exits 2;
anything else is a bug and keeps its traceback. Subsystems subclass it (``HarnessError``,
``ProfileError``, ``KubeconfigError``, ``WaitTimeout``) so their messages reach the user
as they were written: what is wrong and what to do.
"""


class UserError(Exception):
    """An error the user can fix: printed as one line, exit code 2."""


class CLIError(UserError):
    """A command was given bad arguments."""
