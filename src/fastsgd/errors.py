"""Errors a user can cause. The CLI prints them as one line, without a traceback."""

from __future__ import annotations


class UserError(Exception):
    """A mistake in the configuration, the data or the environment that the user can fix.

    The message names the culprit (a config key, a file, a worker rank).
    """


class ConfigError(UserError):
    """An invalid configuration: unknown key, wrong type or range, malformed file."""


class WorkerFailed(RuntimeError):
    """A worker process died or failed with an error that is not the user's to fix; the
    message holds its traceback, if it had one. `died`: the process vanished (SIGKILL,
    SIGTERM, or an exit without a message), as a crashed or killed machine would; not a
    worker that raised, nor one that aborted or faulted in the code it ran (SIGABRT,
    SIGSEGV...: a bug, e.g. a strategy whose collectives differ between workers), which
    a restart would only repeat. `rank`, `step`: the worker, and the step (from 1) it was
    in, where known."""

    def __init__(self, message: str, died: bool = False, rank: int | None = None,
                 step: int | None = None):
        super().__init__(message)
        self.died, self.rank, self.step = died, rank, step

    def placed(self, where: str) -> WorkerFailed:
        """This failure with `where` (" in step 3 of strategy 'x'") told after the worker:
        before the first ": " of its message ("worker 1 failed: ValueError: ...")."""
        head, colon, rest = str(self).partition(": ")
        return WorkerFailed(f"{head}{where}{colon}{rest}", self.died, self.rank, self.step)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a run; `step`: the step every worker stopped after, with a checkpoint
    (None: they had to be killed first). The message says how to resume."""

    def __init__(self, message: str = "", step: int | None = None):
        super().__init__(message)
        self.step = step
