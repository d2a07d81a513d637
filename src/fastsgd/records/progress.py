"""A one-line progress bar with ETA, loss and accuracy (stderr; rank 0 only)."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, enabled: bool = True, width: int = 24):
        self.total, self.enabled, self.width = total, enabled, width
        self.start = time.perf_counter()
        self.tty = sys.stderr.isatty()
        self._last_print = 0.0
        self._next_line = 0.1  # without a terminal, print a line every 10%

    def update(self, done: int, loss: float, accuracy: float | None) -> None:
        if not self.enabled:  # every worker calls it at every step (1024 in a simulation)
            return
        acc = f" acc {accuracy:.2%}" if accuracy is not None else ""
        self.show(done, f"loss {loss:.4f}{acc}")

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
        if self.enabled and self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m:02d}:{s:02d}"
