"""The launcher of `fastsgd run`'s own worker processes (launch.py)."""

import os
import signal
import socket
import time

import pytest

from fastsgd import interrupt
from fastsgd.errors import UserError, WorkerFailed
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


def _die_then_fail():
    interrupt.set_ready(int(os.environ["RANK"]))  # connected: the other can go on without it
    while not all(interrupt._SHARED.ready):
        time.sleep(0.01)
    if os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)  # the launcher has seen the death by now
    raise RuntimeError("could not go on")


@pytest.mark.multiproc
def test_survivors_that_cannot_go_on_make_the_loss_a_fault_to_restart_from():
    with pytest.raises(WorkerFailed, match="worker 1 was killed by signal 9 .*could not go on "
                                           "without it") as failed:
        launch(_die_then_fail, 2, expendable=0)
    assert failed.value.died  # so run.on_failure restarts the run, as for any death


def _die_at_once():
    if os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # as if waiting for it in the rendezvous


@pytest.mark.multiproc
def test_a_death_before_every_worker_is_connected_stops_them_all_at_once():
    """Its peers may be waiting for it in the rendezvous: they are stopped, not left to wait
    for run.timeout, and the death is a fault (restarted by run.on_failure)."""
    began = time.monotonic()
    with pytest.raises(WorkerFailed, match=r"^worker 1 was killed by signal 9 \(SIGKILL\)$"):
        launch(_die_at_once, 2, expendable=0)
    assert time.monotonic() - began < 30


def test_a_busy_rendezvous_port_is_one_line(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setattr("fastsgd.launch.free_port", lambda: port)
        with pytest.raises(UserError, match=f"rendezvous on 127.0.0.1:{port}"):
            launch(lambda: None, 2)
