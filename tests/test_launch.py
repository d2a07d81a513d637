"""The launcher of `fastsgd run`'s own worker processes (launch.py)."""

import pytest

from fastsgd.errors import WorkerFailed
from fastsgd.launch import launch


def _ping(depth: int = 0) -> int:  # two alternating frames: the trace is not folded
    return _pong(depth + 1) + 1


def _pong(depth: int) -> int:
    return _ping(depth + 1) + 1


@pytest.mark.multiproc
def test_workers_whose_error_reports_are_huge_still_report_and_end():
    """A RecursionError's trace runs to hundreds of kB: four of them would fill the error
    queue's pipe and block their workers for good, had their reports not been cut short."""
    with pytest.raises(WorkerFailed, match="RecursionError"):
        launch(_ping, 4)
