"""`Job`: the user's one iteration, run on N real processes or a simulated cluster."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fastsgd import config as cfg
from fastsgd.compress import Compressor, build_compressor
from fastsgd.data import Dataset, load_dataset
from fastsgd.errors import UserError
from fastsgd.launch import launch
from fastsgd.metrics import read_jsonl
from fastsgd.models import build_model
from fastsgd.strategies import Strategy, build_strategy
from fastsgd.strategies.base import check_codec
from fastsgd.transport.sim import Network, simulate
from fastsgd.transport.torch_dist import TorchTransport
from fastsgd.worker import EvalFn, Plan, StepFn, cross_entropy_step, evaluate_classifier, train

ModelArg = str | Callable[[], torch.nn.Module]
OptimizerFn = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]


@dataclass
class Result:
    """What a run leaves: the summary (see DESIGN.md §1) and the run directory."""

    summary: dict[str, Any] | None
    run_dir: Path

    @property
    def accuracy(self) -> float | None:
        return self.summary["final_accuracy"] if self.summary else None

    def metrics(self) -> list[dict[str, Any]]:
        return read_jsonl(self.run_dir / "metrics.jsonl")

    def evals(self) -> list[dict[str, Any]]:
        return read_jsonl(self.run_dir / "eval.jsonl")


class Job:
    """A training job: what to train (model, optimizer, step, data) and how workers talk
    (strategy, compressor). Arguments left out come from `config` (a TOML path or dict),
    then from the defaults; `options` overrides single keys, e.g. {"run.steps": 100}."""

    def __init__(self, model: ModelArg | None = None, optimizer: OptimizerFn | None = None,
                 step: StepFn | None = None, data: str | Dataset | None = None,
                 strategy: str | Strategy | None = None,
                 compressor: str | Compressor | None = None, evaluate: EvalFn | None = None,
                 config: str | Path | dict | None = None, options: dict[str, Any] | None = None,
                 quiet: bool = False):
        raw = cfg.read_toml(Path(config)) if isinstance(config, (str, Path)) else (config or {})
        raw = {s: dict(v) for s, v in raw.items()}
        for key, value in (options or {}).items():
            section, _, name = key.partition(".")
            raw.setdefault(section, {})[name] = value
        for section, arg in (("model", model), ("data", data), ("strategy", strategy),
                             ("compression", compressor)):
            if isinstance(arg, str):
                raw.setdefault(section, {})["name"] = arg
            elif arg is not None and hasattr(arg, "name"):
                raw.setdefault(section, {})["name"] = arg.name
        self.config = cfg.validate(raw)
        self._model, self._optimizer, self._data = model, optimizer, data
        self._strategy, self._compressor = strategy, compressor
        self._step = step or cross_entropy_step
        self._evaluate = evaluate or evaluate_classifier
        self.quiet = quiet

    def run(self, workers: int | None = None) -> Result:
        """Train on real processes: `workers` local processes, or, under torchrun, this
        process as one worker of the torchrun job (any number of nodes)."""
        if "TORCHELASTIC_RUN_ID" in os.environ or "RANK" in os.environ:
            return self._run_here()
        config = self._with_workers(workers)
        plan = self.plan(config)
        run = config["run"]
        launch(lambda: _train_process(plan), run["workers"])
        return _result(plan.run_dir)

    def simulate(self, workers: int | None = None, network: Network | None = None,
                 slowdown: dict[int, float] | None = None) -> Result:
        """Train `workers` logical workers in this process on a virtual clock and network."""
        config = self._with_workers(workers)
        net = network or Network.parse(**config["network"], seed=config["run"]["seed"])
        plan = self.plan(config, simulated=True)
        n = config["run"]["workers"]
        slowdown = slowdown or {r: cfg.slowdown_of(config, r) for r in range(n)}
        simulate(n, lambda t: train(plan, t), net, slowdown)
        return _result(plan.run_dir)

    def _run_here(self) -> Result:
        run = self.config["run"]
        transport = TorchTransport(run["backend"], run["timeout"])
        tag = os.environ.get("TORCHELASTIC_RUN_ID", "torchrun")
        plan = self.plan(cfg.merged(self.config, run={"workers": transport.world_size}),
                         default_out=f"runs/{self.config['strategy']['name']}-{tag}")
        try:
            summary = train(plan, transport)
        finally:
            transport.close()
        return Result(summary, plan.run_dir)

    def _with_workers(self, workers: int | None) -> dict:
        if workers is None:
            return self.config
        return cfg.merged(self.config, run={"workers": workers})

    def plan(self, config: dict, simulated: bool = False, default_out: str | None = None) -> Plan:
        """Resolve everything the workers share (loads the dataset once, before forking)."""
        dataset = self._dataset(config)
        out = config["run"]["out"] or default_out or _default_out(config)
        run_dir = Path(out)
        run_dir.mkdir(parents=True, exist_ok=True)
        if int(os.environ.get("RANK", 0)) == 0:  # a rerun into the same folder starts afresh
            for stale in ("metrics.jsonl", "eval.jsonl", "summary.json"):
                (run_dir / stale).unlink(missing_ok=True)
        config = cfg.merged(config, run={"out": str(run_dir)})
        strategy, codec = self._strategy_object(config), self._codec(config)
        check_codec(strategy, codec, config["run"]["workers"])
        if self._optimizer is None:
            _check_momentum_once(codec, config["optimizer"])
        return Plan(config=config, run_dir=run_dir, dataset=dataset,
                    make_model=self._model_factory(config, dataset),
                    make_optimizer=self._optimizer or optimizer_from_config(config["optimizer"]),
                    step=self._step, evaluate=self._evaluate,
                    strategy=strategy, compressor=codec,
                    simulated=simulated, progress=not self.quiet)

    def _dataset(self, config: dict) -> Dataset:
        if isinstance(self._data, Dataset):
            return self._data
        data = config["data"]
        return load_dataset(data["name"], data["path"] or None, config["run"]["seed"])

    def _model_factory(self, config: dict, dataset: Dataset) -> Callable[[], torch.nn.Module]:
        if callable(self._model):
            return self._model
        name = config["model"]["name"]
        build_model(name, dataset.input_shape, dataset.num_classes)  # fail early on a bad name
        return lambda: build_model(name, dataset.input_shape, dataset.num_classes)

    def _strategy_object(self, config: dict) -> Strategy:
        strategy = self._strategy
        if strategy is None or isinstance(strategy, str):
            strategy = build_strategy(config["strategy"])
        check = getattr(strategy, "check", None)  # e.g. does the topology fit the workers?
        if check is not None:
            check(config["run"]["workers"])
        return strategy

    def _codec(self, config: dict) -> Compressor:
        if self._compressor is not None and not isinstance(self._compressor, str):
            return self._compressor
        return build_compressor(config["compression"])


def optimizer_from_config(section: dict[str, Any]) -> OptimizerFn:
    """The optimizer the [optimizer] section describes (state stays with each worker)."""
    lr, wd = section["lr"], section["weight_decay"]
    if section["name"] == "adam":
        return lambda params: torch.optim.Adam(params, lr=lr, weight_decay=wd)
    momentum, nesterov = section["momentum"], section["nesterov"]
    if nesterov and momentum == 0:
        raise UserError("optimizer.nesterov = true needs optimizer.momentum > 0")
    return lambda params: torch.optim.SGD(params, lr=lr, momentum=momentum,
                                          weight_decay=wd, nesterov=nesterov)


def _check_momentum_once(codec: Compressor, optimizer: dict[str, Any]) -> None:
    """DGC's momentum correction (Lin et al. 2018) moves the momentum into the codec, before
    sparsification; the optimizer's momentum on top would apply it twice and diverge."""
    momentum = getattr(codec, "momentum", 0.0)
    if momentum > 0 and optimizer["name"] == "sgd" and optimizer["momentum"] > 0:
        raise UserError(f"compression.name = '{codec.name}' applies momentum itself "
                        f"(compression.momentum = {momentum}): set optimizer.momentum = 0, "
                        f"not {optimizer['momentum']}")


def _default_out(config: dict) -> str:
    return f"runs/{config['strategy']['name']}-{time.strftime('%Y%m%d-%H%M%S')}"


def _train_process(plan: Plan) -> None:
    run = plan.config["run"]
    transport = TorchTransport(run["backend"], run["timeout"])
    try:
        train(plan, transport)
    finally:
        transport.close()


def _result(run_dir: Path) -> Result:
    import json

    path = run_dir / "summary.json"
    return Result(json.loads(path.read_text()) if path.exists() else None, run_dir)
