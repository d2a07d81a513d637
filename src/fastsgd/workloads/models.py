"""Classification models: an MLP, LeNet-5 and the CIFAR ResNet-20 of He et al. (2016)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fastsgd.errors import UserError

MODELS = ("lenet", "mlp", "resnet20")


def _mlp(input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """Flatten -> 256 -> ReLU -> 256 -> ReLU -> classes."""
    c, h, w = input_shape
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(c * h * w, 256),
        nn.ReLU(),
        nn.Linear(256, 256),
        nn.ReLU(),
        nn.Linear(256, num_classes),
    )


class LeNet5(nn.Module):
    """LeNet-5 with ReLU and max pooling; pads the second conv for small inputs (e.g. 8x8)."""

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int) -> None:
        super().__init__()
        c, h, w = input_shape
        # Unpadded, inputs under 20x20 (e.g. 8x8 digits) would shrink to nothing by the
        # second pooling, so small inputs get padding 2 on the second conv as well.
        pad2 = 0 if min(h, w) >= 20 else 2
        self.features = nn.Sequential(
            nn.Conv2d(c, 6, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, kernel_size=5, padding=pad2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        flat = _flat_size(self.features, input_shape, "lenet")
        self.classifier = nn.Sequential(
            nn.Linear(flat, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        """Logits of shape (B, num_classes)."""
        return self.classifier(self.features(x))


def _flat_size(features: nn.Module, input_shape: tuple[int, int, int], name: str) -> int:
    """Number of features after `features`, from a dummy forward pass."""
    try:
        with torch.no_grad():
            out = features(torch.zeros(1, *input_shape))
    except RuntimeError as exc:
        raise UserError(
            f"input shape {input_shape} is too small for model {name!r} (model.name)"
        ) from exc
    return int(out.shape[1])


class _PadShortcut(nn.Module):
    """Option-A shortcut: subsample spatially and zero-pad the new channels (no parameters)."""

    def __init__(self, stride: int, extra_channels: int) -> None:
        super().__init__()
        self.stride = stride
        self.extra = extra_channels

    def forward(self, x: Tensor) -> Tensor:
        """Identity on the old channels, zeros on the added ones."""
        x = x[:, :, :: self.stride, :: self.stride]
        half = self.extra // 2
        return F.pad(x, (0, 0, 0, 0, half, self.extra - half))


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with a residual connection."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = _PadShortcut(stride, out_channels - in_channels)

    def forward(self, x: Tensor) -> Tensor:
        """relu(bn(conv(relu(bn(conv(x))))) + shortcut(x))."""
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet20(nn.Module):
    """CIFAR ResNet-20: 3 stages of 3 basic blocks (16/32/64 channels), global average pool."""

    def __init__(self, in_channels: int, num_classes: int, blocks_per_stage: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(),
        )
        layers: list[nn.Module] = []
        channels = 16
        for width, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(blocks_per_stage):
                layers.append(BasicBlock(channels, width, stride if i == 0 else 1))
                channels = width
        self.stages = nn.Sequential(*layers)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes)
        )
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(module.weight)

    def forward(self, x: Tensor) -> Tensor:
        """Logits of shape (B, num_classes)."""
        return self.head(self.stages(self.stem(x)))


def _check_shape(input_shape: tuple[int, int, int], num_classes: int) -> None:
    """Reject malformed input shapes and class counts."""
    if len(input_shape) != 3 or any(int(d) < 1 for d in input_shape):
        raise UserError(f"model input shape must be 3 positive ints (C, H, W), got {input_shape}")
    if num_classes < 1:
        raise UserError(f"number of classes must be positive, got {num_classes}")


def build_model(name: str, input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """Build model `name` (one of MODELS) for inputs of shape (C, H, W)."""
    if name not in MODELS:
        raise UserError(f"unknown model {name!r} (model.name); choose one of: "
                        f"{', '.join(MODELS)}, gpt (text, tokens) or module:Name")
    _check_shape(input_shape, num_classes)
    shape = (int(input_shape[0]), int(input_shape[1]), int(input_shape[2]))
    if name == "mlp":
        return _mlp(shape, num_classes)
    if name == "lenet":
        return LeNet5(shape, num_classes)
    return ResNet20(shape[0], num_classes)
