"""Compute lanes (transport/sim/lanes.py): workers' forward, backward and update on threads
beside the scheduler, the same bits (test_sim_determinism.py runs every strategy with and
without them), and none where the order of computing would matter."""

import threading

import pytest
import torch
from torch import nn

import fastsgd as fs
from fastsgd.launch.simulate import compute_lanes
from fastsgd.transport.sim import ComputeModel
from fastsgd.transport.sim.lanes import Lanes, LaneUser, draws_random

FIXED = {"compute.model": "fixed", "compute.step_time": "3ms", "run.steps": 6,
         "run.eval_every": 0, "data.batch_size": 16}


class Dropped(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Dropout(0.5),
                                 nn.Linear(16, 10))

    def forward(self, x):
        return self.net(x)


def _plan(dataset, tmp_path, model, **options):
    job = fs.Job(model=model, data=dataset, quiet=True,
                 options={**FIXED, "run.out": str(tmp_path), "run.workers": 4, **options})
    return job.plan(job.config, simulated=True)


def test_a_step_that_draws_random_numbers_is_found_and_leaves_the_generator_as_it_was():
    torch.manual_seed(0)
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    models = ((Dropped(), True), (nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), False))
    before = torch.get_rng_state()
    for model, draws in models:
        assert draws_random(lambda m=model: nn.functional.cross_entropy(m(x), y)) is draws
        assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("model, strategy, kind, lanes", [
    ("mlp", "allreduce", "fixed", 2),
    ("mlp", "allreduce", "measured", 0),  # the wall time is the charge
    ("mlp", "hogwild", "fixed", 0),  # the workers share their parameters
    (Dropped, "allreduce", "fixed", 0),  # the draws would interleave
])
def test_lanes_only_where_the_order_of_computing_changes_nothing(digits, tmp_path, model,
                                                                 strategy, kind, lanes):
    plan = _plan(digits, tmp_path, model, **{"strategy.name": strategy,
                                             "compute.lanes": 2})
    assert compute_lanes(plan, ComputeModel(kind))[0] == lanes


def test_an_error_in_the_users_step_reads_the_same_on_a_lane(digits, tmp_path):
    def broken(model, batch):
        raise ValueError("the user's step is broken")

    errors = []
    for lanes in (0, 2):
        job = fs.Job(model="mlp", step=broken, data=digits, quiet=True,
                     options={**FIXED, "compute.lanes": lanes,
                              "run.out": str(tmp_path / str(lanes))})
        with pytest.raises(Exception) as failed:
            job.simulate(workers=2)
        errors.append((type(failed.value), str(failed.value)))
    assert errors[0] == errors[1]
    assert "the user's step is broken" in errors[0][1]


def test_deferred_work_is_done_before_the_workers_next_compute_and_meanwhile_it_goes_on():
    lanes = Lanes(2)
    try:
        user, done, went_on = LaneUser(lanes), threading.Event(), []
        gate = threading.Event()  # the deferred work ends only once the worker went on
        user.defer(lambda: (gate.wait(30), done.set()))
        went_on.append(done.is_set())  # the worker went on while its lane mixed
        gate.set()
        seen = user.offload(lambda charged: done.is_set(), lambda: None, lambda: None, [])
        assert went_on == [False] and seen  # on the other lane, it waited all the same
        assert user.pending is None
    finally:
        lanes.close()


def test_no_more_than_ahead_computations_are_out_the_next_is_done_in_place():
    lanes = Lanes(2, ahead=1)
    try:
        first, second, threads, started = LaneUser(lanes), LaneUser(lanes), {}, threading.Event()

        def first_work(charged):
            threads["first"] = threading.current_thread()
            started.set()

        def other_worker_runs():  # while the first worker's compute is out, on a lane
            started.wait()
            second.offload(lambda charged: threads.setdefault("second",
                                                              threading.current_thread()),
                           lambda: None, lambda: None, [])

        first.offload(first_work, lambda: None, other_worker_runs, [])
        assert threads["first"] is not threading.current_thread()
        assert threads["second"] is threading.current_thread()  # no lane would start it
        assert lanes.held == 0
    finally:
        lanes.close()


def test_work_that_frees_memory_goes_before_work_that_makes_it():
    lanes, order, busy, go = Lanes(1), [], threading.Event(), threading.Event()
    lanes.submit(lambda: (busy.set(), go.wait(), order.append("first forward")), heavy=True)
    busy.wait()  # the lane is in it
    lanes.submit(lambda: order.append("second forward"), heavy=True)
    lanes.submit(lambda: order.append("an update"))
    go.set()
    lanes.close()  # the lane does what it was given, then stops
    assert order == ["first forward", "an update", "second forward"]


def test_deferred_work_raises_where_it_is_awaited_and_is_done_in_place_without_lanes():
    lanes = Lanes(1)
    try:
        user = LaneUser(lanes)
        user.defer(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            user.await_deferred()
        user.await_deferred()  # raised once; nothing is left
    finally:
        lanes.close()
    done = []
    LaneUser(None).defer(lambda: done.append(1))
    assert done == [1]


@pytest.fixture(scope="module")
def digits():
    from fastsgd.workloads.data import load_dataset

    return load_dataset("digits", seed=0)
