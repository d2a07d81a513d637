"""A worker process that crashes from within: aborted (SIGABRT: gloo's check that a peer's
message is no longer than expected, a C++ exception nothing caught) or faulted (SIGSEGV,
SIGBUS, SIGFPE, SIGILL) in the code it ran. That is a bug, which a restart would repeat,
not a lost machine (SIGKILL, SIGTERM, a vanished process): the launcher stops the run and
says so, with the Python stack the worker was in (faulthandler writes it, as the process
dies, to a file the launcher made for its rank before forking it).

A worker that raised is told with the step it was in, or, where its traceback shows it
never got that far, as one that failed building its model (`building_model`), in `fastsgd
run` and `fastsgd simulate` alike.
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import tempfile
from collections.abc import Callable

CRASHES = frozenset({signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE,
                     signal.SIGILL})
STACK_CHARS = 4000  # of a crashed worker's Python stack, told with its failure
# in a worker's traceback: loop/worker.py's `train` at its call of plan.make_model()
_BUILDING = re.compile(r'[/\\]fastsgd[/\\]loop[/\\]worker\.py", line \d+, in train\n'
                       r'[ \t]+\S.*\bmake_model\(')


def building_model(trace: str) -> bool:
    """Does a worker's traceback (as traceback.format_exc writes it) show it failed while
    building its model (the user's constructor raised), before any step?"""
    return _BUILDING.search(trace) is not None


def crashed(exitcode: int | None) -> bool:
    """Did the process end by a signal of its own making (CRASHES)?"""
    return exitcode is not None and exitcode < 0 and -exitcode in CRASHES


class Stacks:
    """One file per rank, unlinked, that a forked worker of that rank dumps its Python
    stack into if it crashes (`armed`); the launcher reads it (`read`)."""

    def __init__(self, workers: int):
        self._files = [tempfile.TemporaryFile(prefix="fastsgd-stack-") for _ in range(workers)]

    def armed(self, fn: Callable[[], object]) -> Callable[[], object]:
        """`fn`, run in a forked worker (RANK set) with faulthandler writing to its rank's
        file, emptied first (a new process may take a lost one's rank)."""
        def run() -> object:
            file = self._files[int(os.environ["RANK"])]
            os.ftruncate(file.fileno(), 0)
            os.lseek(file.fileno(), 0, os.SEEK_SET)
            # enable() alone installs no handler where faulthandler was on already (pytest's,
            # or an embedding program's) and a library has since put its own handler in
            # place: the worker then died with no stack (seen in CI). Off first, then on.
            faulthandler.disable()
            faulthandler.enable(file=file, all_threads=True)
            return fn()
        return run

    def read(self, rank: int) -> str:
        """The Python stack that worker `rank` dumped as it crashed ("" if none)."""
        if not 0 <= rank < len(self._files):
            return ""
        dumped = os.pread(self._files[rank].fileno(), 4 * STACK_CHARS, 0)
        return _trimmed(dumped.decode(errors="replace"))[:STACK_CHARS]

    def close(self) -> None:
        for file in self._files:
            file.close()


def _trimmed(dump: str) -> str:
    """faulthandler's dump without what says nothing of the crash: its first line (the
    signal), each thread's frames below `armed` (the launcher's, from before the fork) and
    the list of extension modules."""
    lines, below = [], False
    for line in dump.split("\n"):
        if line.startswith("Extension modules:"):
            break
        if line.startswith("Fatal Python error:"):  # the signal, which the failure names
            continue
        if not line.startswith("  File "):
            below = False
        elif f'"{__file__}"' in line:
            below = True
        if not below:
            lines.append(line)
    return "\n".join(lines).strip()
