"""What a job refuses (or warns of) once, in the launching process, before any worker
starts: each worker would find the same, but only once forked, and 100000 simulated
workers take hours to get there."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from fastsgd.compress import Compressor
from fastsgd.config.keys import SCHEMA
from fastsgd.config.options import reaching_past
from fastsgd.errors import ConfigError, UserError
from fastsgd.frameworks import model_loss_step
from fastsgd.frameworks.base import NO_DDP
from fastsgd.launch.processes import backend_of
from fastsgd.loop.kit.precision import check_precision
from fastsgd.loop.kit.schedule import check as check_schedule
from fastsgd.strategies import Strategy, capabilities_of, hook
from fastsgd.strategies.base import check_codec
from fastsgd.transport.rendezvous import pick_backend
from fastsgd.transport.sim.compute import heterogeneity
from fastsgd.workloads.data import Shard
from fastsgd.workloads.dataset import Dataset


def check_job(config: dict, dataset: Dataset, strategy: Strategy, codec: Compressor,
              make_optimizer: Callable[..., torch.optim.Optimizer], step: Callable) -> None:
    """The pieces together: the data's shards, the strategy with the codec, the workers'
    speeds, the optimizer, and checkpoints."""
    workers = config["run"]["workers"]
    Shard(dataset.train_x, dataset.train_y, config["data"]["batch_size"], 0, workers,
          config["run"]["seed"])
    check_codec(strategy, codec, workers)
    heterogeneity(config["compute"], 0).check(workers)  # real ones too
    if strategy.name == "ddp" and step is model_loss_step:
        raise UserError(NO_DDP)
    _check_momentum_once(codec, config["optimizer"])
    _check_clipping(strategy, config["optimizer"])
    _check_target(config["run"], dataset)
    check_optimizer = hook(strategy, "check_optimizer")
    if check_optimizer is not None:  # on a probe: before any worker starts
        check_optimizer(make_optimizer([torch.nn.Parameter(torch.zeros(1))]), codec)
    if config["run"]["checkpoint_every"] and not capabilities_of(strategy).checkpoints:
        raise ConfigError(f"strategy.name = '{strategy.name}'{_as_set(strategy)} cannot be "
                          "checkpointed yet: what it keeps between steps is not all in its "
                          "state; set run.checkpoint_every = 0")


def _as_set(strategy: Strategy) -> str:
    """Where the strategy's class checkpoints and this one does not (diloco with overlap),
    the options it has off their defaults: one of them is why."""
    if not capabilities_of(type(strategy)).checkpoints:
        return ""
    schema, options = getattr(strategy, "OPTIONS", {}), getattr(strategy, "options", {})
    changed = [f"strategy.{k} = {v!r}" for k, v in options.items()
               if k in schema and v != schema[k].default]
    return f" with {', '.join(changed)}" if changed else ""


def check_run(config: dict, objects: dict[str, Any], total: int, simulated: bool,
              leader: bool, device: torch.device | None) -> None:
    """The run's length against the schedule and the options that count steps (one line
    each on stderr, from the leader), and the precision on the workers' device: `device`,
    a torchrun worker's, else (None) that of the workers this process will fork."""
    check_schedule(config["optimizer"], total)
    check_precision(config["run"]["precision"],
                    _on_cpu(config, objects["strategy"], simulated, device))
    # fastsgd run's own workers (not torchrun's: bench's emulated hosts shape the network)
    ignored = simulator_only(config) if not simulated and device is None else []
    if ignored:
        print(f"fastsgd: {', '.join(ignored)} {'applies' if len(ignored) == 1 else 'apply'} "
              "to fastsgd simulate only: this run on real processes ignores "
              f"{'it' if len(ignored) == 1 else 'them'}", file=sys.stderr, flush=True)
    for section, obj in objects.items() if leader else ():
        for line in reaching_past(section, getattr(obj, "OPTIONS", {}),
                                  getattr(obj, "options", {}), total):
            print(f"fastsgd: {line}", file=sys.stderr, flush=True)


def simulator_only(config: dict) -> list[str]:
    """The keys set off their defaults that only the simulator reads: its network, faults
    and compute trace (compute's timing keys are left out: a spec shares them between its
    real and simulated cells, and they describe the workload, not a setting to act on)."""
    wanted = [("network", k) for k in SCHEMA["network"]] + [
        ("faults", k) for k in SCHEMA["faults"]] + [("compute", "trace")]
    return [f"{section}.{key}" for section, key in wanted
            if config[section][key] != SCHEMA[section][key].default]


def _on_cpu(config: dict, strategy: Strategy, simulated: bool,
            device: torch.device | None) -> bool:
    """Whether the workers run on the CPU, asked without starting CUDA: a process forked
    after torch.cuda.is_available() cannot use CUDA (transport/rendezvous.py)."""
    if simulated:
        return True
    if device is not None:
        return device.type != "cuda"
    return pick_backend(backend_of(config, strategy), local=config["run"]["workers"]) != "nccl"


def _check_momentum_once(codec: Compressor, optimizer: dict[str, Any]) -> None:
    """DGC's momentum correction (Lin et al. 2018) moves the momentum into the codec, before
    sparsification; the optimizer's momentum on top would apply it twice and diverge."""
    momentum = getattr(codec, "momentum", 0.0)
    if momentum > 0 and optimizer.get("momentum", 0) > 0:
        raise UserError(f"compression.name = '{codec.name}' applies momentum itself "
                        f"(compression.momentum = {momentum}): set optimizer.momentum = 0, "
                        f"not {optimizer['momentum']}")


def _check_clipping(strategy: Strategy, optimizer: dict[str, Any]) -> None:
    """optimizer.clip_norm clips what the strategy leaves in p.grad. DeMo leaves its update
    there (strategies/lowcomm/demo.py), not a gradient: sign(Q), whose norm is sqrt(N) at
    every step, so that clipping it only lowers the learning rate (Q with sign = false)."""
    clip = optimizer.get("clip_norm", 0.0)
    if clip > 0 and getattr(strategy, "name", None) == "demo":
        raise ConfigError(f"optimizer.clip_norm = {clip} would clip what strategy.name = "
                          "'demo' leaves in p.grad, its update sign(Q), not a gradient: set "
                          "optimizer.clip_norm = 0")


def _check_target(run: dict[str, Any], dataset: Dataset) -> None:
    """run.target_accuracy set (off its default) on data without a classifier's accuracy to
    aim at, where no run.target_loss replaces it: else it would silently be no target."""
    accuracy = run["target_accuracy"]
    if accuracy in (0, SCHEMA["run"]["target_accuracy"].default) or run["target_loss"] > 0:
        return
    if dataset.kind != "images":
        raise ConfigError(f"run.target_accuracy = {accuracy}: '{dataset.name}' holds "
                          f"{dataset.kind}, whose runs aim at a validation loss: set "
                          "run.target_loss instead")
