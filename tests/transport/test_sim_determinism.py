"""With a modeled compute time, a simulated run is a pure function of its config and seed:
bitwise the same model.pt, metrics.jsonl and eval.jsonl (time column included), whatever
else the machine is doing, for every strategy, with jitter, stragglers, noise and loss on."""

import threading

import pytest
import torch

import fastsgd as fs
from fastsgd.strategies import STRATEGIES, capabilities_of

NOISY = {"compute.model": "fixed", "compute.step_time": "3ms", "compute.update": "200us",
         "compute.reduce_bandwidth": "5GB", "compute.slowdown": [1, 1.5],
         "compute.straggler_prob": 0.2, "compute.sigma": 0.3, "network.bandwidth": "1Gbit",
         "network.latency": "1ms", "network.jitter": "2ms", "network.loss": 0.05}
FILES = ("model.pt", "metrics.jsonl", "eval.jsonl")


def _run(dataset, out, strategy: str, **extra):
    options = {"run.steps": 24, "run.eval_every": 8, "data.batch_size": 16, "run.out": str(out),
               "strategy.name": strategy, **NOISY, **extra}
    if strategy == "ltfb":
        options["strategy.period"] = 6
    job = fs.Job(model="mlp", data=dataset, options=options, quiet=True)
    return job.simulate(workers=4).run_dir


class _Busy:
    """Other work on the machine: matrix products on another thread."""

    def __enter__(self):
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._burn, daemon=True)
        self.thread.start()

    def _burn(self):
        # its own generator: a draw from the global one, landing between a worker's seed
        # and its model's initialization, changed the run (seen once, adpsgd, in a full suite)
        a = torch.randn(400, 400, generator=torch.Generator().manual_seed(0))
        while not self.stop.is_set():
            a = torch.tanh(a @ a)

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


@pytest.mark.parametrize("strategy", [name for name in STRATEGIES  # not ddp: torch's own
                                      if not capabilities_of(STRATEGIES.get(name)).real_only])
def test_same_config_same_bits(strategy, synthetic, tmp_path):
    """Also whether workers compute on the scheduler's thread or on two compute lanes
    beside it (transport/sim/lanes.py), in whatever order the machine's load gives."""
    first = _run(synthetic, tmp_path / "a", strategy, **{"compute.lanes": 0})
    with _Busy():
        second = _run(synthetic, tmp_path / "b", strategy, **{"compute.lanes": 2})
    for name in FILES:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


@pytest.mark.parametrize("strategy", ["allreduce", "dpsgd", "sgp"])
def test_lanes_that_may_compute_only_one_worker_ahead_give_the_same_bits(strategy, synthetic,
                                                                        tmp_path, monkeypatch):
    """Lanes compute at most `ahead` workers' steps ahead of the scheduler, the others in
    place (lanes.ahead_for: memory): which ones go where changes nothing."""
    first = _run(synthetic, tmp_path / "a", strategy, **{"compute.lanes": 0})
    monkeypatch.setattr("fastsgd.launch.simulate.ahead_for", lambda model, lanes: 1)
    second = _run(synthetic, tmp_path / "b", strategy, **{"compute.lanes": 2})
    for name in FILES:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_the_seed_changes_the_draws(synthetic, tmp_path):
    """Not a constant: another seed gives other stragglers, noise and jitter."""
    first = _run(synthetic, tmp_path / "a", "sgp")
    other = _run(synthetic, tmp_path / "b", "sgp", **{"run.seed": 1})
    assert (first / "metrics.jsonl").read_bytes() != (other / "metrics.jsonl").read_bytes()


def test_a_profiled_run_repeats_from_its_config(synthetic, tmp_path):
    """profile measures once and writes the times into config.toml; simulating that file
    charges the same times and gives the same bits."""
    options = {"run.steps": 12, "run.eval_every": 6, "data.batch_size": 16,
               "strategy.name": "adpsgd", "network.latency": "1ms"}
    first = fs.Job(model="mlp", data=synthetic, quiet=True,
                   options={**options, "run.out": str(tmp_path / "a")}).simulate(4).run_dir
    config = (first / "config.toml").read_text()
    assert 'forward = "' in config and 'forward = ""' not in config
    again = fs.Job(model="mlp", data=synthetic, config=first / "config.toml", quiet=True,
                   options={"run.out": str(tmp_path / "b")}).simulate().run_dir
    for name in FILES:
        assert (first / name).read_bytes() == (again / name).read_bytes(), name


@pytest.mark.parametrize("strategy", ["allreduce", "sgp", "ps"])
def test_watching_is_free(strategy, synthetic, tmp_path):
    """Evaluating every 3 steps (consensus distance, representative, accuracy) changes no
    clock, no byte count and no parameter: metrics.jsonl and model.pt are the same bits as
    with one evaluation at the end."""
    watched = _run(synthetic, tmp_path / "a", strategy, **{"run.eval_every": 3})
    alone = _run(synthetic, tmp_path / "b", strategy, **{"run.eval_every": 0})
    for name in ("metrics.jsonl", "model.pt"):
        assert (watched / name).read_bytes() == (alone / name).read_bytes(), name
    assert len((watched / "eval.jsonl").read_text().splitlines()) == 24 // 3
