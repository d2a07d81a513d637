"""Learning-rate schedules (schedule.py): a pure function of the step, set on every param
group from its own base rate."""

import math

import pytest
import torch

from fastsgd.errors import ConfigError
from fastsgd.loop.kit.schedule import Schedule, check, factor


def section(**kit):
    return {"lr": 0.1, "schedule": "constant", "warmup": 0, "min_lr": 0.0, "decay_every": 0,
            "decay_factor": 0.1, **kit}


def test_warmup_rises_linearly_to_the_rate():
    kit = section(warmup=4)
    assert [factor(k, 10, kit) for k in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_cosine_starts_at_the_rate_after_warmup_and_ends_at_min_lr():
    kit = section(schedule="cosine", warmup=2, min_lr=0.01)
    lrs = [0.1 * factor(k, 12, kit, min_ratio=0.1) for k in range(12)]
    assert lrs[:3] == pytest.approx([0.05, 0.1, 0.1])  # warmup, then the full rate
    assert lrs[-1] == pytest.approx(0.01)  # the last step: min_lr
    cosine = [0.01 + 0.09 * (1 + math.cos(math.pi * j / 9)) / 2 for j in range(10)]
    assert lrs[2:] == pytest.approx(cosine)


def test_linear_falls_to_min_lr_on_the_last_step():
    kit = section(schedule="linear")
    assert [factor(k, 5, kit, 0.2) for k in range(5)] == pytest.approx([1, 0.8, 0.6, 0.4, 0.2])


def test_step_decays_every_decay_every_steps_and_by_default_in_thirds():
    kit = section(schedule="step", decay_every=3, decay_factor=0.5, warmup=1)
    assert [factor(k, 9, kit) for k in range(9)] == [1, 1, 1, 1, 0.5, 0.5, 0.5, 0.25, 0.25]
    thirds = section(schedule="step")  # 0: three levels over the run
    assert [factor(k, 7, thirds) for k in range(7)] == pytest.approx(
        [1, 1, 1, 0.1, 0.1, 0.1, 0.01])


def test_a_run_of_one_step_after_warmup_ends_at_min_lr():
    assert factor(2, 3, section(schedule="cosine", warmup=2), 0.5) == 0.5
    assert math.isfinite(factor(0, 1, section(schedule="linear")))


def test_a_warmup_longer_than_the_run_is_one_line_naming_the_key():
    check(section(warmup=10), 10)  # as long as the run: allowed
    with pytest.raises(ConfigError, match=r"^optimizer\.warmup = 11 is longer than the run "
                                          r"\(10 steps\)[^\n]*$"):
        check(section(warmup=11), 10)


def test_each_group_keeps_its_own_base_rate():
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([{"params": [a]}, {"params": [b], "lr": 0.01}], lr=0.1)
    schedule = Schedule(section(schedule="linear", min_lr=0.05), total=3)
    schedule.start(optimizer)
    lrs = []
    for k in range(3):
        schedule.apply(optimizer, k)
        lrs += [g["lr"] for g in optimizer.param_groups]
    # min_lr is half of optimizer.lr: every group ends at half its own rate
    assert lrs == pytest.approx([0.1, 0.01, 0.075, 0.0075, 0.05, 0.005])
    schedule.start(optimizer)  # again (a rejoin): the base rates stay
    assert [g["initial_lr"] for g in optimizer.param_groups] == [0.1, 0.01]


def test_a_constant_rate_leaves_the_groups_alone():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    schedule = Schedule(section(), total=5)
    schedule.start(optimizer)
    optimizer.param_groups[0]["lr"] = 0.3  # e.g. a strategy's adjustment
    schedule.apply(optimizer, 2)
    assert optimizer.param_groups[0]["lr"] == 0.3 and "initial_lr" not in \
        optimizer.param_groups[0]
