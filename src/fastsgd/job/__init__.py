"""`Job`: the user's one iteration, run on N real processes or a simulated cluster."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fastsgd import pack
from fastsgd.compress import Compressor, build_compressor
from fastsgd.config import schema as cfg
from fastsgd.config.objects import described, is_import_path, resolve
from fastsgd.errors import ConfigError, UserError
from fastsgd.frameworks import brings_its_step, model_loss_step
from fastsgd.job.config import assembled, check_resume_options, resume_config
from fastsgd.launch.local import launch
from fastsgd.launch.preflight import check_job, check_run
from fastsgd.launch.processes import door_of, expendable, rejoin_steps, train_process
from fastsgd.launch.simulate import check_faults, prepared, simulate_plan
from fastsgd.launch.supervise import supervise
from fastsgd.launch.torchrun import NO_JOIN, train_under_torchrun
from fastsgd.loop.components import (
    function_argument,
    function_from_config,
    model_argument,
    model_factory,
)
from fastsgd.loop.kit.optimizers import OptimizerFn, optimizer_from_config
from fastsgd.loop.language import for_data, gpt_factory, step_for_data
from fastsgd.loop.plan import EvalFn, Plan, StepFn, evaluate_classifier
from fastsgd.loop.results import Result, result_of
from fastsgd.pack import PACKED, PackedFactory
from fastsgd.records.checkpoint import steps
from fastsgd.records.resumable import check_has_checkpoint, check_not_finished, check_unchanged
from fastsgd.records.rundir import (
    agree,
    claim,
    default_out,
    dropped_if_empty,
    make_run_folder,
    release,
)
from fastsgd.strategies import CHOICES, Strategy, build_strategy, capabilities_of, hook
from fastsgd.transport.sim import ComputeModel, Faults, Network
from fastsgd.transport.torch_dist import TorchTransport
from fastsgd.workloads.data import load_dataset
from fastsgd.workloads.dataset import Dataset
from fastsgd.workloads.models import build_model
from fastsgd.workloads.torch_data import data_argument

ModelArg = str | Callable[[], torch.nn.Module] | torch.nn.Module


class Job:
    """A training job: what to train (model, optimizer, step, data) and how workers talk
    (strategy, compressor). Arguments left out come from `config` (a TOML path or dict),
    then from the defaults; `options` overrides single keys, e.g. {"run.steps": 100}.
    Objects given here are recorded in the run's config.toml as what they are (see
    components.py). A run never overwrites another unless `options` names `run.out` or
    `overwrite` is set (see rundir.py). As `fastsgd run` does, a run ends with its report
    (RUN_DIR/report/) and its summary printed, unless `quiet` (or `report=False`).
    `validation`, a torch dataset beside a torch dataset as `data`, is what evaluation
    scores; without it every 20th sample of `data` is held out (said in one line)."""

    def __init__(self, model: ModelArg | None = None, optimizer: OptimizerFn | None = None,
                 step: StepFn | None = None, data: str | Dataset | Any = None,
                 strategy: str | Strategy | None = None,
                 compressor: str | Compressor | None = None, evaluate: EvalFn | None = None,
                 config: str | Path | dict | None = None, options: dict[str, Any] | None = None,
                 quiet: bool = False, overwrite: bool = False, resume: str | Path | None = None,
                 report: bool | None = None, validation: Any = None):
        if not isinstance(options, dict | None):  # else a TypeError deep in config.py
            raise UserError(f"options must be a dict of 'section.key': value; got "
                            f"{described(options)}")
        if not isinstance(config, str | Path | dict | None):
            raise UserError(f"config must be a TOML file's path or a dict; got {described(config)}")
        # resume: the run's own config and folder, then `options`; with a config given too,
        # a folder without a checkpoint yet is started (the same command line after a
        # restart, as under torchrun --max-restarts)
        self._fresh_if_none = resume is not None and config is not None
        if resume is not None:
            check_resume_options(Path(resume), options or {}, overwrite)
            config, options = resume_config(Path(resume), config), {
                **(options or {}), "run.out": str(resume)}
        data = data_argument(data, validation, quiet)
        given = {"model": model, "step": step, "evaluate": evaluate, "optimizer": optimizer,
                 "data": data, "strategy": strategy, "compressor": compressor}
        self.config, options = assembled(config, options or {}, given)
        if resume is not None:
            check_unchanged(Path(resume), self.config)
        self._resolve(given)
        self.quiet, self.overwrite, self.resume = quiet, overwrite, resume is not None
        # as `fastsgd run` ends: RUN_DIR/report/ and the summary printed (unless quiet)
        self._report = not quiet if report is None else report
        self._out_given = "run.out" in options

    def _resolve(self, given: dict[str, Any]) -> None:
        """The pieces the config names, where no object was given (fails early, one line)."""
        section = self.config["model"]
        if section["packed"] or PACKED in (section["name"], section["step"]):
            self._model, self._step = self._packed(given)
        else:
            self._model = model_argument(given["model"]) or model_factory(section["name"])
            if brings_its_step(self._model) and section["step"] == "cross_entropy":
                section["step"] = "model_loss"  # a JAX model's own loss, unless told
            self._step = (function_argument("step", given["step"])
                          or function_from_config("step", section["step"]))
        self._evaluate = (function_argument("evaluate", given["evaluate"])
                          or function_from_config("evaluate", section["evaluate"]))
        optimizer = given["optimizer"]
        self._optimizer = optimizer if callable(optimizer) else optimizer_from_config(
            self.config["optimizer"])
        self._data = given["data"]
        self._strategy, self._compressor = given["strategy"], given["compressor"]

    def _packed(self, given: dict[str, Any]) -> tuple[PackedFactory, StepFn]:
        """model.packed: the model, the step and the initial parameters are the archive's."""
        section = self.config["model"]
        if not section["packed"]:
            raise ConfigError(f"model.name = '{section['name']}', model.step = "
                              f"'{section['step']}': 'packed' needs model.packed = PATH, a "
                              "job archive from fastsgd pack")
        for key, arg in (("name", "model"), ("step", "step")):
            if section[key] != PACKED or given[arg] is not None:
                raise ConfigError(f"model.packed = '{section['packed']}' holds the model and "
                                  f"the step: leave model.{key} out")
        return PackedFactory(section["packed"], pack.versions()), model_loss_step

    def pack(self, out: str | Path) -> Path:
        """Write this job to `out`, a job archive (.fsj) that `fastsgd run`, `simulate` and
        torchrun train without this job's Python source (see pack/)."""
        if self._evaluate is not evaluate_classifier:
            raise UserError("model.evaluate is the user's Python code, which a job archive "
                            "does not carry; a packed job is evaluated by accuracy")
        config = self.config
        dataset = self._dataset(config)
        return pack.pack(config, self._model_factory(config, dataset),
                         step_for_data(self._step, dataset), dataset, out)

    def run(self, workers: int | None = None) -> Result:
        """Train on real processes: `workers` local processes, or, under torchrun, this
        process as one worker of the torchrun job (any number of nodes)."""
        if "TORCHELASTIC_RUN_ID" in os.environ or "RANK" in os.environ:
            return self._run_here()
        hazard = getattr(self._model, "fork_hazard", None)
        if hazard is not None and hazard():  # e.g. JAX, already running in this process
            raise UserError(hazard())
        config = self._with_workers(workers)
        plan = self.plan(config)
        with dropped_if_empty(plan.run_dir, self._names_the_folder(config)):
            failures = supervise(plan, lambda attempt: launch(
                lambda: train_process(plan), config["run"]["workers"], restart=attempt,
                expendable=expendable(plan), survivors_stop=config["run"]["on_failure"] == "stop",
                rejoin=rejoin_steps(plan), door=door_of(plan)))
        return self._reported(result_of(plan.run_dir, failures))

    def _reported(self, result: Result) -> Result:
        """The run's report and summary, as the CLI writes and prints them."""
        if self._report and result.summary is not None:
            from fastsgd.report import text_report, write_run_report

            *lines, last = text_report(result.run_dir).splitlines()
            page = write_run_report(result.run_dir)
            print("\n".join([*lines, f"report         {page}", last]))  # the folder last
        return result

    def _names_the_folder(self, config: dict) -> bool:
        """fastsgd chose the run directory (runs/STRATEGY-TIME), not the user."""
        return not config["run"]["out"] and not self.resume

    def simulate(self, workers: int | None = None, network: Network | None = None,
                 compute: ComputeModel | None = None) -> Result:
        """Train `workers` logical workers in this process on a virtual clock and network.
        The `[network]` and `[compute]` sections describe them, unless given here (then
        the run's config.toml records these as their keys)."""
        config, net = prepared(self._with_workers(workers), network, compute)  # recorded
        faults = Faults.parse(config["faults"], config["run"]["workers"], config["run"]["rejoin"])
        if config["run"]["join"]:
            raise ConfigError(NO_JOIN.format(where="the simulator", instead="run.rejoin = "
                                             "true starts new workers in lost ones' places"))
        strategy = self._strategy_object(config)
        if capabilities_of(strategy).real_only:
            raise ConfigError(f"strategy.name = '{strategy.name}' runs on real processes only "
                              "(fastsgd run); in the simulator, allreduce is the same algorithm")
        check_faults(faults, strategy, self._codec(config), config)
        plan = self.plan(config, simulated=True)
        with dropped_if_empty(plan.run_dir, self._names_the_folder(config)):
            simulate_plan(plan, net, faults)
        return self._reported(result_of(plan.run_dir))

    def _run_here(self) -> Result:
        """One worker of a torchrun job (torchrun.py)."""
        summary, plan = train_under_torchrun(
            self.config, lambda config, transport: self.plan(config, transport=transport))
        return Result(summary, plan.run_dir)

    def _with_workers(self, workers: int | None) -> dict:
        if workers is None:
            return self.config
        return cfg.merged(self.config, CHOICES, run={"workers": workers})

    def plan(self, config: dict, simulated: bool = False,
             transport: TorchTransport | None = None, writer: bool = True) -> Plan:
        """Resolve everything the workers share (loads the dataset once, before forking);
        under torchrun, `transport` lets every rank agree on the run directory. The run
        directory is locked for this run (rundir.hold) unless not `writer`: a worker that
        joins the run holding it (fastsgd join)."""
        dataset = self._dataset(config)
        make_model = self._model_factory(config, dataset)  # first: does it take this data?
        strategy, codec = self._strategy_object(config), self._codec(config)
        check_job(config, dataset, strategy, codec, self._optimizer, self._step)
        run_dir = self._run_dir(config, transport, writer)
        try:
            return self._plan_in(run_dir, config, dataset, make_model, strategy, codec,
                                 simulated, transport)
        except BaseException:
            release(run_dir)  # held by _run_dir; else the run releases it as it ends
            raise

    def _plan_in(self, run_dir: Path, config: dict, dataset: Dataset,
                 make_model: Callable[[], torch.nn.Module], strategy: Strategy,
                 codec: Compressor, simulated: bool, transport: TorchTransport | None) -> Plan:
        config = cfg.merged(config, CHOICES, run={"out": str(run_dir)})
        plan = Plan(config=config, run_dir=run_dir, dataset=dataset, make_model=make_model,
                    make_optimizer=self._optimizer, step=step_for_data(self._step, dataset),
                    evaluate=for_data(self._evaluate, dataset),
                    strategy=strategy, compressor=codec, simulated=simulated,
                    progress=not self.quiet, resume=self.resume,
                    # a folder with checkpoints goes on from one, damaged or not
                    fresh_if_none=self._fresh_if_none and not steps(run_dir))
        total = plan.total_steps(config["run"]["workers"])
        if self.resume:
            check_not_finished(run_dir, total)
        leader = transport is None or transport.rank == 0
        check_run(config, {"strategy": strategy, "compression": codec}, total, simulated,
                  leader, transport.device if transport else None)
        if dataset.about and leader:
            (run_dir / "data.json").write_text(json.dumps(dataset.about, indent=1) + "\n")
        return plan

    def _run_dir(self, config: dict, transport: TorchTransport | None,
                 writer: bool = True) -> Path:
        out = config["run"]["out"]
        name = ""
        if transport is None or transport.rank == 0:
            reuse = bool(out) and self._out_given or self.overwrite
            if self.resume:  # refused before a resume with a config would clear it
                check_has_checkpoint(Path(out))
            # resume with a config: the folder as it is once it holds a checkpoint (else a
            # fresh start clears it); the checkpoints were removed as an old run's files
            resuming = self.resume and (not self._fresh_if_none or bool(steps(Path(out))))
            name = str(claim(out or default_out(config["strategy"]["name"]), reuse, resuming,
                             writer))
        if transport is not None and transport.world_size > 1:
            name = agree(name, transport)
            make_run_folder(Path(name), out or name, exist_ok=True)  # each node its own files
        return Path(name)

    def _dataset(self, config: dict) -> Dataset:
        if isinstance(self._data, Dataset):
            return self._data
        data = config["data"]
        if is_import_path(data["name"]):
            resolve(data["name"], "data.name")  # says why it cannot be rebuilt
        return load_dataset(data["name"], data["path"] or None, config["run"]["seed"],
                            context=config["model"]["context"], dtype=data["dtype"],
                            vocab=data["vocab"])

    def _model_factory(self, config: dict, dataset: Dataset) -> Callable[[], torch.nn.Module]:
        check = getattr(self._model, "check_data", None)  # a packed or a JAX model's
        if check is not None:
            check(dataset, config["data"]["batch_size"])
        if self._model is not None:
            return self._model
        name = config["model"]["name"]
        if name == "gpt" or dataset.kind != "images":
            return gpt_factory(config["model"], dataset)
        build_model(name, dataset.input_shape, dataset.num_classes)  # fail early on a bad name
        return lambda: build_model(name, dataset.input_shape, dataset.num_classes)

    def _strategy_object(self, config: dict) -> Strategy:
        strategy = self._strategy
        if strategy is None or isinstance(strategy, str):
            strategy = build_strategy(config["strategy"])
        check = hook(strategy, "check")  # e.g. does the topology fit the workers?
        if check is not None:
            check(config["run"]["workers"])
        return strategy

    def _codec(self, config: dict) -> Compressor:
        if self._compressor is not None and not isinstance(self._compressor, str):
            return self._compressor
        return build_compressor(config["compression"])

