"""The launcher of `fastsgd run`'s own worker processes (launch.py)."""

import multiprocessing as mp
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from fastsgd.control import interrupt
from fastsgd.control.interrupt import Stop
from fastsgd.errors import Interrupted, UserError, WorkerFailed
from fastsgd.launch.forking import Told
from fastsgd.launch.local import _stop, _wait, launch


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
    while any(_alive(child) for child in _siblings()):  # worker 1 is dead (not yet reaped:
        time.sleep(0.01)  # the launcher may see both ends at once, or this one first)
    raise RuntimeError("could not go on")


def _siblings() -> list[int]:
    children = Path(f"/proc/{os.getppid()}/task/{os.getppid()}/children").read_text().split()
    return [int(pid) for pid in children if int(pid) != os.getpid()]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


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


def test_the_rendezvous_port_is_held_before_the_workers_start(monkeypatch):
    # a port chosen, released and bound again after the fork could be given in between to
    # another job's port-0 socket (CI: two parity tests at once, EADDRINUSE in one and a
    # stranger on the other's message port)
    held = []

    def forked(procs):
        port = int(procs[0]._args[3])
        with socket.socket() as s, pytest.raises(OSError):
            s.bind(("127.0.0.1", port))
        held.append(port)
        for p in procs:
            p.start()

    monkeypatch.setattr("fastsgd.launch.local.forked", forked)
    launch(lambda: None, 2)
    assert held


def test_no_rendezvous_socket_is_one_line(monkeypatch):
    def refused(*args, **kwargs):
        raise OSError(98, "Address already in use")

    monkeypatch.setattr("fastsgd.launch.local.socket.create_server", refused)
    with pytest.raises(UserError, match="rendezvous on 127.0.0.1: .*Address already in use"):
        launch(lambda: None, 2)


@pytest.mark.multiproc
def test_a_loss_seen_in_one_look_with_its_peers_error_is_named_as_the_cause():
    # worker 0's error (it could not go on) and worker 1's death end in the same look of the
    # launcher, worker 0 first in its list: the death is the cause, the error its consequence
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=sys.exit, args=(1,)),
             ctx.Process(target=lambda: os.kill(os.getpid(), signal.SIGKILL))]
    for p in procs:
        p.start()
    while not all(p.exitcode is not None for p in procs):  # both ended, neither seen yet
        time.sleep(0.01)
    with pytest.raises(WorkerFailed, match="worker 1 was killed by signal 9 .*could not go on "
                                           "without it"):
        _wait(procs, Told(ctx.SimpleQueue()), expendable=0, ready=[1, 1])


@pytest.mark.multiproc
def test_a_loss_right_after_the_start_up_barrier_is_carried_though_a_peer_is_not_flagged_yet():
    # worker 1 passed the start-up barrier (flagged ready) and died in its first step before
    # worker 2, released from the same barrier, had set its flag: every worker had entered
    # the barrier, so the group had formed and the others carry on
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=time.sleep, args=(0.3,)),
             ctx.Process(target=lambda: os.kill(os.getpid(), signal.SIGKILL)),
             ctx.Process(target=time.sleep, args=(0.3,))]
    for p in procs:
        p.start()
    _wait(procs, Told(ctx.SimpleQueue()), expendable=0, ready=[1, 1, 0])
    assert [p.exitcode for p in procs] == [0, -signal.SIGKILL, 0]


@pytest.mark.multiproc
def test_ctrl_c_while_the_workers_start_stops_those_started():
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=time.sleep, args=(0.1,)), ctx.Process(target=time.sleep)]
    procs[0].start()  # the Ctrl-C came before the second was forked
    with pytest.raises(Interrupted) as stopped:
        _stop(procs, Stop(ctx, 2))
    assert stopped.value.step is None  # not every worker wrote a checkpoint
    assert procs[0].exitcode == 0


class _InterruptingStart:
    """A process whose start() gets a Ctrl-C, as a fork that the user interrupts."""

    started = 0

    def start(self):
        os.kill(os.getpid(), signal.SIGINT)
        _InterruptingStart.started += 1


def test_a_ctrl_c_during_the_forks_is_raised_after_them():
    """A Ctrl-C inside a fork was raised in an after-fork hook, where Python ignores it, and
    the run went on to its end: forked() holds it back until every process has started."""
    from fastsgd.launch.forking import forked

    _InterruptingStart.started = 0
    with pytest.raises(KeyboardInterrupt):
        forked([_InterruptingStart(), _InterruptingStart()])
    assert _InterruptingStart.started == 2


@pytest.mark.multiproc
def test_the_launcher_never_asks_cuda_before_it_forks(tmp_path, monkeypatch):
    """torch.cuda.is_available() (through the CUDA driver) leaves forked workers unable to
    use CUDA: the launcher asks NVML only (torch.cuda.device_count), fp16's check too."""
    import torch

    import fastsgd as fs

    def poisoned() -> bool:
        raise AssertionError("torch.cuda.is_available() in the launcher")

    monkeypatch.setattr(torch.cuda, "is_available", poisoned)
    result = fs.Job(model="mlp", data="digits", quiet=True,
                    options={"run.steps": 3, "run.eval_every": 0, "run.precision": "bf16",
                             "run.out": str(tmp_path)}).run(workers=2)
    assert result.summary["steps"] == 3


@pytest.mark.multiproc
def test_a_real_run_says_which_simulator_settings_it_ignores(tmp_path, capsys):
    import fastsgd as fs

    fs.Job(model="mlp", data="digits", quiet=True,
           options={"run.steps": 2, "run.eval_every": 0, "run.out": str(tmp_path),
                    "network.bandwidth": "1Mbit", "faults.crash": [{"worker": 1, "step": 1}],
                    "compute.model": "fixed", "compute.step_time": "1ms"}).run(workers=2)
    assert ("fastsgd: network.bandwidth, faults.crash apply to fastsgd simulate only: this "
            "run on real processes ignores them\n") in capsys.readouterr().err
