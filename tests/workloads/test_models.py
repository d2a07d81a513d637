"""Tests for fastsgd.workloads.models: output shapes, parameter counts, errors."""

from __future__ import annotations

import pytest
import torch

from fastsgd.errors import UserError
from fastsgd.workloads.models import MODELS, build_model

SHAPES = [(1, 28, 28), (1, 8, 8), (3, 32, 32)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", MODELS)
def test_logits_shape(name: str, shape: tuple[int, int, int]) -> None:
    torch.manual_seed(0)
    model = build_model(name, shape, num_classes=7)
    batch = 2 if name == "resnet20" else 5
    out = model(torch.randn(batch, *shape))
    assert out.shape == (batch, 7)
    assert torch.isfinite(out).all()


def test_mlp_parameter_count() -> None:
    model = build_model("mlp", (1, 28, 28), num_classes=10)
    expected = 784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10
    assert sum(p.numel() for p in model.parameters()) == expected


def test_resnet20_size() -> None:
    model = build_model("resnet20", (3, 32, 32), num_classes=10)
    assert 0.26e6 < sum(p.numel() for p in model.parameters()) < 0.28e6  # ~0.27M in the paper


def test_lenet_classic_flatten_size() -> None:
    model = build_model("lenet", (1, 28, 28), num_classes=10)
    assert model.classifier[0].in_features == 16 * 5 * 5


def test_unknown_model() -> None:
    with pytest.raises(UserError, match="'vgg'.*model.name.*lenet, mlp, resnet20"):
        build_model("vgg", (1, 28, 28), 10)


def test_too_small_input_for_lenet() -> None:
    with pytest.raises(UserError, match="lenet"):
        build_model("lenet", (1, 1, 1), 10)
