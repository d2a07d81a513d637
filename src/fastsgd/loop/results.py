"""The end of a worker's run: the last evaluation, the totals every worker adds to, and the
leader's summary.json and model.pt; and what a Job returns of them (Result)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fastsgd.control import interrupt
from fastsgd.loop.context import LoopContext
from fastsgd.loop.evaluate import evaluate
from fastsgd.loop.observe import METRICS, Target
from fastsgd.records.metrics import (
    failures_of,
    loss_metrics,
    read_jsonl,
    write_atomically,
    write_json,
)
from fastsgd.records.trained import sample
from fastsgd.strategies.capabilities import capabilities_of


def finish(ctx: LoopContext, wall_time: float) -> dict[str, Any] | None:
    """Collective: the last evaluation if it is due, the totals; the leader's summary."""
    ctx.t.await_deferred()  # the model is read
    end = ctx.clock()
    evaluating = ctx.log.wall  # before the last evaluation, which `wall_time` was taken before
    if ctx.state.evaluated != ctx.steps:
        evaluate(ctx, ctx.steps)
    state = ctx.state
    lead = _lead(ctx) if _drains_async(ctx) else 0.0  # the same on every worker: collective
    totals = torch.tensor([state.sent, state.received, _rate(ctx, end, lead), state.skipped,
                           state.idle, state.dropped], dtype=torch.float64, device=ctx.t.device)
    ctx.t.all_reduce(totals)
    # the run ends with its last worker: asynchronous ones end apart (hogwild with a slow
    # worker, a drain), and every evaluation is timed by the last worker to reach it
    ends = ctx.t.all_gather(torch.tensor([end, wall_time - evaluating], dtype=torch.float64,
                                          device=ctx.t.device))
    end, training_wall = (max(float(e[i]) for e in ends) for i in (0, 1))
    if ctx.rank != ctx.leader:
        return None
    if ctx.log.last is None:  # worker 0 was lost after the last evaluation
        ctx.log.take_over()
    # in the simulator, all have handed in: totals waited; a leader that took over after
    # the last evaluation has its own replica (the run ended averaged, or on its own); not
    # bool(module): a torch.compile'd one refuses len()
    model = ctx.log.model[1] if ctx.log.model[1] is not None else ctx.model
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}  # loads anywhere
    write_atomically(ctx.plan.run_dir / "model.pt", lambda f: torch.save(state, f))
    written = summary(ctx, training_wall, end, totals.tolist())
    write_json(ctx.plan.run_dir / "summary.json", written)
    if ctx.plan.config["run"]["tensorboard"]:  # from the metrics every worker flushed
        ctx.events.file(ctx.wall()).update()
    return written


def rejoined_workers(ctx: LoopContext) -> list[dict[str, Any]]:
    """Each worker lost and replaced by a new process that joined (run.rejoin): its rank,
    the step the new one joined at, the steps the lost one had done (the launcher's count
    for the last one of a rank; else the step after its last message to this worker), and
    when it was lost."""
    rejoins = [r for r in getattr(ctx.t, "rejoins", lambda: [])()
               if r["back_at_step"] is not None]
    last = {r["rank"]: r for r in rejoins}  # the launcher knows how far the last one got
    return [{"worker": r["rank"], "joined_at_step": r["back_at_step"],
             "left_at_step": (interrupt.left_after(r["rank"]) if r is last[r["rank"]]
                              else None) or r["left_at_step"],
             "time": round(r["lost_at"] - ctx.state.start, 3)}
            for r in rejoins]


def _rate(ctx: LoopContext, end: float, lead: float = 0.0) -> float:
    """This worker's samples a second: every step it trained, the last included, over the
    run's clock when the last one ended (`end`; evaluations and checkpoints are not on it).
    In a lockstep or periodic strategy the last step's synchronization (an all-reduce, an
    outer step, a final average) is part of the method's cost, and is charged. Two cases
    differ:

    - an asynchronous drain (capabilities.async_drain: ssp, ps, sgp, adpsgd, async_diloco):
      on its last step a fast worker waits for the slowest, for being faster (before, it
      waited for no one, or only within a bound). That wait, `lead` (how far its
      second-to-last step ended ahead of the slowest worker's, _lead), is not charged to
      it; the rest of the drain, its own messages still queued on the network, is.
    - a worker whose strategy ended its training (Context.end; `idle_steps`): the steps it
      trained, over the clock when its last one ended."""
    state, steps, seconds = ctx.state, ctx.steps, end - lead
    if state.idle:
        steps, seconds = ctx.steps - state.idle, state.penultimate or end
    # no time passed (no compute, no network: a model of nothing): no rate, not a rate of 0
    return steps * _worker_batch(ctx) / seconds if seconds > 0 else math.nan


def _lead(ctx: LoopContext) -> float:
    """Collective: how long before the slowest worker this one ended its second-to-last
    step (0 for the slowest, or where there was no such step)."""
    mine = ctx.state.penultimate
    at = torch.tensor([math.nan if mine is None else mine], dtype=torch.float64,
                      device=ctx.t.device)
    ends = [float(e[0]) for e in ctx.t.all_gather(at)]
    known = [e for e in ends if not math.isnan(e)]
    return max(known) - mine if mine is not None and known else 0.0


def _drains_async(ctx: LoopContext) -> bool:
    """Does this run's strategy drain asynchronously (capabilities.async_drain)?"""
    return capabilities_of(ctx.replica.strategy).async_drain


def _worker_batch(ctx: LoopContext) -> int:
    """The samples of one of a worker's steps: run.accumulate micro-batches of batch_size."""
    return ctx.plan.config["data"]["batch_size"] * ctx.accumulate


def summary(ctx: LoopContext, wall_time: float, end: float, totals: list[float]) -> dict[str, Any]:
    cfg = ctx.plan.config
    last = ctx.log.last
    assert last is not None
    return {
        "strategy": cfg["strategy"]["name"], "compressor": cfg["compression"]["name"],
        "topology": cfg["strategy"].get("topology", "complete"),
        "workers": ctx.world, "steps": ctx.steps,
        "epochs": ctx.steps / ctx.shard.steps_per_epoch,
        "global_batch": ctx.world * _worker_batch(ctx),
        "final_accuracy": number(last[1]), "final_loss": number(last[2]),
        **final_loss_metrics(last[2], ctx.log.kind), "data_kind": ctx.log.kind,
        **targets(ctx.log.target), "time_to_target": ctx.log.time_to_target,
        "wall_to_target": ctx.log.wall_to_target,
        # to the ns, as eval.jsonl's times are: unrounded, an evaluation at the end
        # could read a hair later than the run's end
        "wall_time": wall_time, "simulated_time": round(end, 9) if ctx.plan.simulated
        else None,
        "eval_time": ctx.log.wall, "evaluations": ctx.log.count,
        "samples_per_second": number(totals[2]),
        "bytes_sent_total": int(totals[0]), "bytes_received_total": int(totals[1]),
        "skipped_steps": int(totals[3]),  # worker-steps with a NaN or inf loss or gradient
        # worker-steps not trained (a straggler the strategy ended: Context.end), and those
        # trained whose work it dropped
        "idle_steps": int(totals[4]), "dropped_steps": int(totals[5]),
        "consensus_distance": number(last[3]), "representative": cfg["run"]["representative"],
        "lost_workers": ctx.lost_workers(),
        "rejoined_workers": rejoined_workers(ctx),
        "mode": "simulated" if ctx.plan.simulated else "real",
        "run_dir": str(ctx.plan.run_dir),
    }


def targets(target: Target) -> dict[str, Any]:
    """summary.json's target: which metric and value (null: none), and as target_accuracy
    or target_loss (the other null), as runs before loss targets said it."""
    return {"target": target.described(),
            **{f"target_{m}": target.value if target and target.metric == m else None
               for m in METRICS}}


def final_loss_metrics(loss: float, kind: str) -> dict[str, float | None]:
    """final_perplexity, and final_bits_per_byte (null but for byte-level text)."""
    metrics = loss_metrics(loss, kind)
    return {"final_perplexity": number(metrics.get("perplexity", math.nan)),
            "final_bits_per_byte": number(metrics.get("bits_per_byte", math.nan))}


def number(value: float) -> float | None:
    """`value`, or None (null) for a NaN or inf: summary.json stays JSON that any reader
    takes (a diverged model's loss is NaN; eval.jsonl keeps it, as metrics.jsonl does)."""
    return value if math.isfinite(value) else None


@dataclass
class Result:
    """What a run leaves: the summary (see DESIGN.md §1) and the run directory."""

    summary: dict[str, Any] | None
    run_dir: Path

    @property
    def accuracy(self) -> float | None:
        return self.summary["final_accuracy"] if self.summary else None

    @property
    def loss(self) -> float | None:
        """The final validation loss (null in summary.json, None here, if not finite)."""
        return self.summary["final_loss"] if self.summary else None

    def sample(self, prompt: str = "", tokens: int = 200, **options: Any) -> str:
        """Text drawn from the run's GPT: `prompt` and `tokens` more (options: temperature,
        top_k, seed; records/trained.py)."""
        return sample(self.run_dir, prompt, tokens, **options)

    def metrics(self) -> list[dict[str, Any]]:
        return read_jsonl(self.run_dir / "metrics.jsonl")

    def evals(self) -> list[dict[str, Any]]:
        return read_jsonl(self.run_dir / "eval.jsonl")


def result_of(run_dir: Path, failures: list[dict[str, Any]] | None = None) -> Result:
    """The run's summary; the failures (worker processes that died and the restarts that
    followed, in this process: `failures`, and in those it resumes: failures.json) are
    added to summary.json."""
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text()) if path.exists() else None
    failures = failures_of(run_dir) or failures
    if summary is not None and failures:
        summary["failures"] = failures
        write_json(path, summary)
    return Result(summary, run_dir)
