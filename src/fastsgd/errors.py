"""Errors a user can cause. The CLI prints them as one line, without a traceback."""


class UserError(Exception):
    """A mistake in the configuration, the data or the environment that the user can fix.

    The message names the culprit (a config key, a file, a worker rank).
    """


class ConfigError(UserError):
    """An invalid configuration: unknown key, wrong type or range, malformed file."""


class WorkerFailed(RuntimeError):
    """A worker process died or failed with an error that is not the user's to fix; the
    message holds its traceback, if it had one. `died`: the process vanished (a signal, or
    an exit without a message), as a crashed or killed machine would."""

    def __init__(self, message: str, died: bool = False):
        super().__init__(message)
        self.died = died


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a run; `step`: the step every worker stopped after, with a checkpoint
    (None: they had to be killed first). The message says how to resume."""

    def __init__(self, message: str = "", step: int | None = None):
        super().__init__(message)
        self.step = step
