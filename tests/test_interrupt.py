"""Ctrl-C under torchrun: the workers agree through the store on one step to stop after
(interrupt.StoreStop); the end-to-end test is in test_torchrun.py."""

import time

import pytest
import torch.distributed as dist

from fastsgd.interrupt import StoreStop


def _stops(monkeypatch, n: int) -> list[StoreStop]:
    monkeypatch.setattr(StoreStop, "LOOK_EVERY", 0.0)  # look at every step
    store = dist.HashStore()
    return [StoreStop(store, rank, n) for rank in range(n)]


def _run(stops: list[StoreStop], ahead: list[int], asked: int, at: int) -> list[int]:
    """Workers `ahead[r]` steps ahead of worker 0 step in turn; worker `asked` gets SIGINT
    once worker 0 has done `at` steps. The step each stopped after."""
    steps, stopped = list(ahead), [0] * len(stops)
    for k in range(1, 1000):
        if k == at:
            stops[asked].on_sigint()
        for r, stop in enumerate(stops):
            if not stopped[r]:
                steps[r] += 1
                stopped[r] = steps[r] if stop.after(r, steps[r]) else 0
        if all(stopped):
            return stopped
    raise AssertionError(f"never stopped: {stopped}")


@pytest.mark.parametrize("asked", [0, 2])
def test_every_worker_stops_after_the_same_step_ahead_of_the_furthest(monkeypatch, asked):
    stops = _stops(monkeypatch, 3)
    stopped = _run(stops, ahead=[0, 5, 2], asked=asked, at=10)
    assert len(set(stopped)) == 1
    assert stopped[0] >= 10 + 5  # the furthest worker had not gone past it


def test_sigint_from_torchruns_agent_right_after_the_terminals_is_the_same_request(
        monkeypatch):
    stop = _stops(monkeypatch, 1)[0]
    stop.on_sigint()
    stop.on_sigint()  # torchrun forwards the same Ctrl-C: no KeyboardInterrupt
    stop.asked = time.monotonic() - StoreStop.AGAIN_AFTER - 1
    with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C later stops at once
        stop.on_sigint()


def test_a_restarted_job_does_not_see_the_last_attempts_stop(monkeypatch):
    store = dist.HashStore()
    monkeypatch.setattr(StoreStop, "LOOK_EVERY", 0.0)
    first = StoreStop(store, 0, 1)
    first.on_sigint()
    assert any(first.after(0, k) for k in range(1, 10))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    again = StoreStop(store, 0, 1)
    assert not any(again.after(0, k) for k in range(1, 50))
