"""All-reduces asked during a simulated backward (allreduce's buckets, `strategy.overlap`)
start at the virtual time their gradients are ready, with compute lanes or without
(SimTransport.compute), and bytes are counted for the workers that take part."""

import json

import pytest
import torch

import fastsgd as fs
from fastsgd.transport.base import ring_allgather_bytes, ring_allreduce_bytes
from fastsgd.transport.sim import ComputeModel, Faults, Network, simulate
from fastsgd.transport.sim.compute import to_ns
from fastsgd.transport.sim.faults import Crash
from fastsgd.transport.sim.lanes import Deferred
from fastsgd.workloads.data import load_dataset

NET = Network.parse("100Mbit", "1ms", mtu=0)  # payload bytes only: S/B
MS = 1_000_000  # ns
FIXED = ComputeModel("fixed", {"forward": 10 * MS, "backward": 20 * MS, "update": 0, "codec": 0})


def _hooks_then_backward(t, sizes, block=False):
    """A step as worker.py runs it: forward + backward offloaded, whose backward asks an
    all-reduce per size (rank 0 only; the others ask theirs at time 0), then the backward
    charged. The clock after each wait: when the all-reduce ended, for the idle worker."""
    tensors = [torch.ones(n) for n in sizes]
    if t.rank == 0:
        handles = []

        def work(charged):
            charged()
            handles.extend(t.all_reduce(x, async_op=not block) for x in tensors)

        t.offload(work, lambda: t.compute("forward", 0))
        t.compute("backward", 0)
    else:
        handles = [t.all_reduce(x, async_op=True) for x in tensors]
    ends = []
    for handle in handles:
        handle.wait()
        ends.append(t.now_ns())
    return ends, [float(x[0]) for x in tensors]


@pytest.mark.parametrize("lanes", [0, 2])
def test_each_all_reduce_starts_when_the_part_of_backward_that_made_it_is_done(lanes):
    sizes = [1000, 3000]  # 4 kB, then 12 kB: a quarter of the backward, then all of it
    out = simulate(2, lambda t: _hooks_then_backward(t, sizes), NET, FIXED, lanes=lanes)
    first = 10 * MS + 20 * MS * 4000 // 16000 + to_ns(NET.allreduce_time(4000, 2))
    second = 30 * MS + to_ns(NET.allreduce_time(12000, 2))  # as the backward ends
    assert out[1] == ([first, second], [2.0, 2.0])  # the idle worker woke as each ended
    assert out[0] == ([30 * MS, second], [2.0, 2.0])  # rank 0 waits after its backward


def test_measured_compute_starts_them_when_asked():
    def worker(t):
        asked = []
        t.offload(lambda charged: (charged(), asked.append(t.all_reduce(torch.ones(4),
                                                                         async_op=True))),
                  lambda: t.compute("forward", 0))
        t.compute("backward", 0)
        asked[0].wait()
        return isinstance(asked[0], Deferred)

    assert simulate(2, worker, NET, ComputeModel()) == [False, False]  # not recorded


def test_an_all_reduce_asked_where_no_backward_follows_starts_at_the_offloads_end():
    def worker(t):
        asked = []
        t.offload(lambda charged: (asked.append(t.all_reduce(torch.ones(250), async_op=True)),
                                   charged()), lambda: t.compute("update", 0))
        asked[0].wait()
        return t.now_ns()

    assert simulate(2, worker, NET, FIXED) == [to_ns(NET.allreduce_time(1000, 2))] * 2


def test_a_blocking_all_reduce_in_backward_is_an_error_on_a_lane_and_runs_without():
    out = simulate(2, lambda t: _hooks_then_backward(t, [250, 250], block=True), NET, FIXED)
    assert [sums for _, sums in out] == [[2.0, 2.0]] * 2
    with pytest.raises(RuntimeError, match="a blocking all-reduce during"):
        simulate(2, lambda t: _hooks_then_backward(t, [250], block=True), NET, FIXED, lanes=2)


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


def _rows(digits, out, **options):
    options = {"run.steps": 4, "run.eval_every": 0, "run.workers": 2, "run.out": str(out),
               "compute.model": "fixed", "compute.step_time": "5ms", **options}
    run = fs.Job(model="mlp", data=digits, options=options, quiet=True).simulate()
    return [json.loads(line) for line in (run.run_dir / "metrics.jsonl").open()]


def test_with_overlap_no_step_ends_before_the_slow_workers_backward(digits, tmp_path):
    """The MLP's gradients fit one bucket: it starts as backward ends, overlap or not."""
    slow = {"compute.slowdown": [1, 3]}
    rows = _rows(digits, tmp_path / "on", **slow)
    first = [row["time"] for row in rows if row["step"] == 1]
    assert min(first) >= 0.015  # the slow worker's forward + backward: 3 x 5 ms
    off = _rows(digits, tmp_path / "off", **slow, **{"strategy.overlap": False})
    assert [row["time"] for row in rows] == [row["time"] for row in off]


def test_one_bucket_hides_nothing_behind_backward(digits, tmp_path):
    slow_net = {"compute.step_time": "300ms", "network.bandwidth": "100Mbit"}
    on = _rows(digits, tmp_path / "on", **slow_net)
    off = _rows(digits, tmp_path / "off", **slow_net, **{"strategy.overlap": False})
    assert min(row["aggregation"] for row in on) > 0.02  # 340 kB over 100 Mbit/s, and more
    assert [row["aggregation"] for row in on] == [row["aggregation"] for row in off]


def test_bytes_are_counted_for_the_survivors_ring():
    def worker(t):
        t.compute("update", 0)  # worker 2 crashes here
        t.barrier()  # done among 0 and 1 once the loss is known
        before = t.bytes_sent
        t.all_reduce(torch.ones(1000))
        t.all_gather(torch.ones(1000))
        t.broadcast(torch.ones(1000), src=1)
        return t.bytes_sent - before

    faults = Faults({2: [Crash(2, step=0)]}, detect_ns=MS)
    sent = simulate(3, worker, NET, FIXED, faults)
    ring = ring_allreduce_bytes(4000, 2) + ring_allgather_bytes(4000, 2)
    assert sent == [ring, ring + 4000, None]  # rank 1 broadcasts to its one peer


def test_after_a_crash_the_survivors_log_the_smaller_rings_bytes(digits, tmp_path):
    rows = _rows(digits, tmp_path, **{"run.workers": 4, "run.steps": 12,
                                      "faults.crash": [{"worker": 3, "step": 6}]})
    sent = {row["step"]: row["bytes_sent"] for row in rows if row["rank"] == 0}
    size = 340_008  # the MLP's gradients on digits, in bytes
    assert [sent[k] for k in range(1, 8)] == [ring_allreduce_bytes(size, 4)] * 7 == [510_012] * 7
    # step 8's all-reduce is asked before the loss is known (faults.detect): counted for 4
    assert [sent[k] for k in range(9, 13)] == [ring_allreduce_bytes(size, 3)] * 4
    assert ring_allreduce_bytes(size, 3) == 453_344
