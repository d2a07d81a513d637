"""The in-memory dataset every workload becomes (`Dataset`), and the checks it makes of
itself when made: the user's own as much as the built-in ones (data.py loads those)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from fastsgd.errors import UserError
from fastsgd.workloads.kinds import REGRESSION


@dataclass(frozen=True)
class Dataset:
    """A dataset held in memory: for images x is float32 (N, C, H, W) and y int64 labels;
    see `kind` for the others.
    Checked when made (by hand, too): int32 y and the like become int64 (exact); x of
    another dtype or sample shape suits one's own model only (the default step casts a
    floating x to the model's dtype)."""

    name: str
    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor
    num_classes: int
    # (name, path, seed) when made by load_dataset: how a run's config.toml can rebuild it
    source: tuple[str, str, int] | None = field(default=None, compare=False)
    # "images" (x: (N, C, H, W) floats), "text" (x: windows of bytes, vocabulary 256),
    # "tokens" (x: windows of token ids) or "regression" (y: floats, (N,) or (N, outputs),
    # num_classes the outputs): what the default model, step and evaluation take
    kind: str = field(default="images", compare=False)
    default_steps: int = field(default=0, compare=False)  # run.epochs = 0: this many, if set
    about: dict = field(default_factory=dict, compare=False)  # data.json: the corpus
    # a language model's training stream, if train_x holds its windows cut at a stride of
    # one window less a token: each epoch then draws them at fresh offsets (shard.py)
    train_tokens: Tensor | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            y = _check_split(self, split)
            if y is not getattr(self, f"{split}_y"):  # frozen: the exact int64 copy goes in
                object.__setattr__(self, f"{split}_y", y)
        if self.test_x.shape[1:] != self.train_x.shape[1:]:  # a model takes one shape
            raise UserError(f"Dataset '{self.name}': test_x holds samples of shape "
                            f"{tuple(self.test_x.shape[1:])} but train_x of "
                            f"{tuple(self.train_x.shape[1:])}; both splits need the same")
        _check_labels(self)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """Shape (C, H, W) of one input sample (what the built-in models are made for)."""
        if self.train_x.dim() != 4 or not self.train_x.is_floating_point():
            raise UserError(f"Dataset '{self.name}': the built-in models take floating-point "
                            f"train_x of shape (N, C, H, W); got {str(self.train_x.dtype)[6:]} "
                            f"{tuple(self.train_x.shape)}: convert it, or give a model of "
                            "your own (model=)")
        c, h, w = self.train_x.shape[1:]
        return int(c), int(h), int(w)


def _tensor(data: Dataset, key: str, shape: str) -> Tensor:
    """Field `key`, if it is a tensor of `shape`'s number of dims (at least, for images)."""
    value = getattr(data, key)
    if not isinstance(value, Tensor):
        kind = type(value)
        name = kind.__qualname__ if kind.__module__ == "builtins" else \
            f"{kind.__module__}.{kind.__qualname__}"
        hint = " (torch.from_numpy turns it into one)" if isinstance(value, np.ndarray) else ""
        raise UserError(f"Dataset '{data.name}': {key} must be a torch.Tensor of shape "
                        f"{shape}; got a {name}{hint}")
    dims = (1, 2) if key.endswith("_y") and data.kind == REGRESSION else (1,)
    if (value.dim() not in dims) if key.endswith("_y") else (value.dim() < 2):
        pairs = key.endswith("_y") and value.dim() == 2 and not value.is_floating_point()
        hint = (" (for a language model, give each sample as one tensor of model.context + "
                "1 token ids, not nanoGPT's (x, y) pair: the step shifts it)") if pairs else ""
        raise UserError(f"Dataset '{data.name}': {key} must be a torch.Tensor of shape "
                        f"{shape}; got shape {tuple(value.shape)}{hint}")
    return value


def _check_split(data: Dataset, split: str) -> Tensor:
    """One split's x and y: tensors of one length, not empty, y integers (x of any dtype:
    one's own model may take float64 or token ids); the labels y, as int64 (a regression's
    targets: as they are)."""
    x = _tensor(data, f"{split}_x", "(N, C, H, W)")
    targets = "(N,) or (N, outputs)" if data.kind == REGRESSION else "(N,)"
    y = _tensor(data, f"{split}_y", targets)
    where = f"Dataset '{data.name}': {split}"
    if len(x) != len(y):
        raise UserError(f"{where}_x has {len(x)} samples but {split}_y has {len(y)}")
    if not len(x):
        raise UserError(f"{where}_x holds no samples; the {split} split needs at least one")
    if data.kind == REGRESSION:
        return _check_targets(y, where, split)
    if y.dtype == torch.bool or y.is_floating_point() or y.is_complex():
        raise UserError(f"{where}_y is {str(y.dtype)[6:]}; it must hold integer class "
                        f"labels (int64: {split}_y.long()), or floating-point targets with "
                        "kind='regression'")
    return y.long()  # int32, uint8...: exact; int64 is y itself


def _check_targets(y: Tensor, where: str, split: str) -> Tensor:
    """A regression's targets: finite floats (a NaN target makes every loss NaN)."""
    if not y.is_floating_point():
        raise UserError(f"{where}_y is {str(y.dtype)[6:]}; a regression's targets are "
                        f"floating-point ({split}_y.float())")
    if not bool(torch.isfinite(y).all()):
        bad = int((~torch.isfinite(y)).nonzero()[0, 0])
        raise UserError(f"{where}_y[{bad}] is {float(y.reshape(len(y), -1)[bad].sum())}; "
                        "a regression's targets must be finite")
    return y


def _check_labels(data: Dataset) -> None:
    """num_classes a positive int and every label in [0, num_classes): one pass over y."""
    n = data.num_classes
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise UserError(f"Dataset '{data.name}': num_classes must be a positive int; got {n!r}")
    if data.kind == REGRESSION:  # num_classes: the outputs, one per target column
        outputs = [1 if y.dim() == 1 else y.shape[1] for y in (data.train_y, data.test_y)]
        if outputs != [n, n]:
            raise UserError(f"Dataset '{data.name}': train_y and test_y hold {outputs[0]} "
                            f"and {outputs[1]} targets per sample; num_classes (the "
                            f"outputs) is {n}")
        return
    for split in ("train", "test"):
        low, high = (int(v) for v in torch.aminmax(getattr(data, f"{split}_y")))
        if low < 0:
            raise UserError(f"Dataset '{data.name}': {split}_y holds a negative label "
                            f"({low}); labels go from 0 to num_classes - 1 = {n - 1}")
        if high >= n:
            raise UserError(f"Dataset '{data.name}': {split}_y holds labels up to {high} "
                            f"but num_classes is {n}")
