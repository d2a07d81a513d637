"""A model of your own: a small convolutional network for the 8x8 `digits`.

A class (or function) that takes no arguments and returns a torch.nn.Module; every worker
makes its own from the same seed.

    fastsgd simulate --set model.name=my_model:TinyConv --set data.name=digits
"""

from __future__ import annotations

import torch
from torch import nn


class TinyConv(nn.Module):
    """Two 3x3 convolutions and a linear layer: 1x8x8 images, 10 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
        self.head = nn.Linear(16 * 2 * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))
