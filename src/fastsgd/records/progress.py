"""A one-line progress bar with ETA, the training loss and the last evaluation (stderr;
rank 0 only).

The evaluation shown is what the run is scored by: the validation accuracy of a classifier,
the validation loss of a language model (text, tokens data), a regression or a run with
`run.target_loss`. A bar that `follow`s the run's evaluation log reads the latest evaluation
from it at every step; its last line, at the last step, waits for `close`, so that it shows
the final evaluation, which comes after the last step (in the simulator an evaluation is
recorded once every worker has handed its replica in, after worker 0 has gone on)."""

from __future__ import annotations

import math
import sys
import time
from typing import Any, Protocol

from fastsgd.workloads.kinds import LOSS_KINDS


class Evaluations(Protocol):
    """What the bar reads of a run's evaluation log (loop/observe.py's EvalLog)."""

    kind: str  # the dataset's kind (workloads/kinds.py)
    target: Any  # its `metric`: "accuracy" or "loss"
    last: tuple[int, float, float, float] | None  # step, accuracy, loss, consensus


def shown_metric(kind: str, target: str = "accuracy") -> str:
    """What the bar shows of an evaluation: "loss" (the validation loss) for data scored by
    its loss (language models, regression) or a run with a loss target, else "accuracy"."""
    return "loss" if target == "loss" or kind in LOSS_KINDS else "accuracy"


class Progress:
    def __init__(self, total: int, enabled: bool = True, width: int = 24):
        self.total, self.enabled, self.width = total, enabled, width
        self.start = time.perf_counter()
        self.tty = sys.stderr.isatty()
        self._last_print = 0.0
        self._next_line = 0.1  # without a terminal, print a line every 10%
        self._log: Evaluations | None = None
        self.metric = "accuracy"
        # the last step's (done, loss, accuracy given), shown at close with its evaluation
        self._held: tuple[int, float, float | None] | None = None

    def follow(self, log: Evaluations) -> None:
        """Read the evaluations from `log` (the latest at each update and at close, in place
        of the accuracy `update` is given), and show what the run is scored by."""
        self._log = log
        self.metric = shown_metric(log.kind, getattr(log.target, "metric", "accuracy"))

    def update(self, done: int, loss: float, accuracy: float | None = None) -> None:
        """Step `done` ended with training loss `loss`; `accuracy`: the last evaluation's
        (unless the bar follows a log). The last step's line is held for `close`."""
        if not self.enabled:  # every worker calls it at every step (1024 in a simulation)
            return
        if done >= self.total:
            self._held = (done, loss, accuracy)
            return
        self.show(done, self.note(loss, accuracy))

    def note(self, loss: float, accuracy: float | None = None) -> str:
        """The training loss, then the last evaluation's accuracy or validation loss."""
        value = self._evaluated(accuracy)
        if value is None or (self.metric == "accuracy" and math.isnan(value)):
            return f"loss {loss:.4f}"
        shown = f"acc {value:.2%}" if self.metric == "accuracy" else f"val loss {value:.4f}"
        return f"loss {loss:.4f} {shown}"

    def _evaluated(self, accuracy: float | None) -> float | None:
        if self._log is None:
            return accuracy
        last = self._log.last
        return None if last is None else last[1 if self.metric == "accuracy" else 2]

    def show(self, done: int, note: str) -> None:
        """The bar at `done` of `total`, with the elapsed time, the ETA and `note`."""
        if not self.enabled:
            return
        now = time.perf_counter()
        if self.tty and now - self._last_print < 0.2 and done < self.total:
            return
        if not self.tty and done / self.total < self._next_line and done < self.total:
            return
        self._last_print = now
        self._next_line = (int(done / self.total * 10) + 1) / 10
        sys.stderr.write(("\r" if self.tty else "") + self.line(done, note, now)
                         + ("" if self.tty else "\n"))
        sys.stderr.flush()

    def line(self, done: int, note: str, now: float) -> str:
        elapsed = now - self.start
        eta = elapsed / done * (self.total - done) if done else 0.0
        filled = int(self.width * done / self.total)
        bar = "#" * filled + "." * (self.width - filled)
        return f"[{bar}] {done}/{self.total} {_clock(elapsed)}<{_clock(eta)} {note}"

    def close(self) -> None:
        """The last step's line, with the evaluation the log holds now (the final one, once
        the run has finished), and the end of the line on a terminal."""
        if self.enabled and self._held is not None:
            done, loss, accuracy = self._held
            self._held = None
            self.show(done, self.note(loss, accuracy))
        if self.enabled and self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m:02d}:{s:02d}"
