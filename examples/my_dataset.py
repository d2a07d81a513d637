"""A dataset of your own: two interleaved spirals, points drawn from a seed.

`data.name = "module:function"` names a function (or class) that takes no arguments and
returns a `fastsgd.data.Dataset`: train and test tensors x (N, C, H, W) and labels y (N,),
and the number of classes. Here each sample is a 2-d point, shaped (1, 1, 2).

    fastsgd simulate --set data.name=my_dataset:spirals
"""

from __future__ import annotations

import math

import torch

from fastsgd.workloads.dataset import Dataset


def _spirals(count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` points on two spirals (labels 0 and 1), with a little noise."""
    labels = torch.randint(0, 2, (count,), generator=generator)
    turn = torch.rand(count, generator=generator) * 3 * math.pi
    radius = turn / (3 * math.pi)
    angle = turn + math.pi * labels
    points = torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], dim=1)
    points += 0.02 * torch.randn(count, 2, generator=generator)
    return points.view(count, 1, 1, 2), labels


def spirals(seed: int = 0, train: int = 2048, test: int = 512) -> Dataset:
    """2048 training and 512 test points of two spirals."""
    generator = torch.Generator().manual_seed(seed)
    train_x, train_y = _spirals(train, generator)
    test_x, test_y = _spirals(test, generator)
    return Dataset("spirals", train_x, train_y, test_x, test_y, num_classes=2)
