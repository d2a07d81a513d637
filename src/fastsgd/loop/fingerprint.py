"""What profiled times were measured for (`compute.profiled`, loop/profiling.py): the config
keys and the model's properties that change them, flat, as the keys are named. A config
whose times were measured for another fingerprint is profiled again; one that differs only
in its strategy measures only the strategy's round; the cells of a bench that share a
workload (the fingerprint but the strategy) share one profile (bench/profiles.py)."""

from __future__ import annotations

from typing import Any

import torch

from fastsgd.loop.plan import Plan

# config keys whose value the times depend on, beside the optimizer's (but lr), the codec's
# and the strategy's; the last four came later: a profile written before them had their
# defaults (one pass of data.batch_size, no autocast, no dropout), which
# profiling._difference assumes
CONFIG_KEYS = ("model.name", "model.step", "model.packed", "data.name", "data.batch_size",
               "run.accumulate", "run.precision", "model.heads", "model.dropout")
ADDED = CONFIG_KEYS[-4:]
SECTIONS = ("optimizer", "compression", "strategy")  # every key of theirs, but lr


def fingerprint(plan: Plan) -> dict[str, Any]:
    """What the profiled times were measured for: the config keys and the model's
    properties that change them (flat, as the keys are named)."""
    with torch.random.fork_rng(devices=[]):  # the run's random draws stay as they were
        params = list(plan.make_model().parameters())
    out = _config_keys(plan.config)
    out.update({"input_shape": list(plan.dataset.train_x.shape[1:]),
                "parameters": sum(p.numel() for p in params),
                "dtype": ",".join(sorted({str(p.dtype).removeprefix("torch.") for p in params}))})
    return out


def _config_keys(config: dict) -> dict[str, Any]:
    """The fingerprint's config keys, as written (a value TOML cannot hold: its repr)."""
    out = {key: config[key.partition(".")[0]][key.partition(".")[2]] for key in CONFIG_KEYS}
    for section in SECTIONS:
        out.update({f"{section}.{k}": v if isinstance(v, (str, int, float, bool, list))
                    else repr(v) for k, v in config[section].items() if k != "lr"})
    return out


def workload(config: dict) -> dict[str, Any]:
    """What a config's times are a function of, its strategy and codec aside: the
    fingerprint's keys, and for what the fingerprint reads off the model and data (the
    parameters, the input's shape), the model's and data's sections whole. Cells of a bench
    that agree on it share one profile (bench/profiles.py)."""
    whole = {f"{s}.{k}": v for s in ("model", "data") for k, v in config[s].items()}
    return but_exchange({**_config_keys(config), **whole})


EXCHANGE = ("strategy", "compression")  # what moves the gradients, not what makes them


def but_exchange(measured_for: dict[str, Any]) -> dict[str, Any]:
    """What the forward, backward and update times depend on: all but the strategy's and
    the codec's keys (and the times of their own)."""
    return {k: v for k, v in measured_for.items()
            if k.partition(".")[0] not in EXCHANGE and k not in ("strategy", "codec")}
