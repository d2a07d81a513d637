"""A torch dataset given to the Python API (`Job(data=...)`), map-style or iterable, read
once into a `Dataset`: samples that are (x, y) pairs are a classification set (integer y)
or a regression (floating-point y: a number or a vector per sample); samples
that are one integer tensor each, of one length, are windows of token ids (a language
model's: the model scores each token after the first). Every HOLD_EVERY-th sample is held
out for evaluation, the same ones in every run."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset as TorchDataset
from torch.utils.data import IterableDataset

from fastsgd.errors import UserError
from fastsgd.workloads.dataset import Dataset
from fastsgd.workloads.kinds import REGRESSION
from fastsgd.workloads.text import DEFAULT_STEPS

HOLD_EVERY = 20  # 5% held out
MAX_SAMPLES = 2 ** 24  # an iterable that yields more is taken for an endless stream


def is_torch_dataset(obj: Any) -> bool:
    return isinstance(obj, (TorchDataset, IterableDataset))


def from_torch(data: Any) -> Dataset:
    """`data`'s samples as a Dataset (module docstring), or one line saying why not."""
    name = type(data).__name__
    samples = _samples(data, name)
    if len(samples) < 2:
        raise UserError(f"the torch dataset {name} holds {len(samples)} samples; at least 2 "
                        "are needed (one is held out for evaluation)")
    held = [i % HOLD_EVERY == HOLD_EVERY - 1 or i == len(samples) - 1 and len(samples) < 20
            for i in range(len(samples))]
    first = samples[0]
    if isinstance(first, Tensor):
        return _windows(samples, held, name)
    if not (isinstance(first, (tuple, list)) and len(first) == 2):
        raise UserError(f"the torch dataset {name} yields {type(first).__name__}; fastsgd "
                        "takes samples that are (x, y) pairs or tensors of token ids")
    x = _stacked([s[0] for s in samples], name, "x")
    y = _stacked([torch.as_tensor(s[1]) for s in samples], name, "y")
    keep = torch.tensor([not h for h in held])
    if y.is_floating_point():  # targets to fit, not labels
        outputs = 1 if y.dim() == 1 else int(y[0].numel())
        y = y.reshape(len(y), outputs) if y.dim() > 2 else y
        return Dataset(name, x[keep], y[keep], x[~keep], y[~keep], outputs, kind=REGRESSION)
    return Dataset(name, x[keep], y[keep], x[~keep], y[~keep],
                   int(y.max()) + 1 if len(y) else 1)


def _samples(data: Any, name: str) -> list[Any]:
    if isinstance(data, IterableDataset) or not hasattr(data, "__len__"):
        out = []
        for sample in _iterated(data, name):
            out.append(sample)
            if len(out) > MAX_SAMPLES:
                raise UserError(f"the torch dataset {name} yields more than {MAX_SAMPLES} "
                                "samples (endless?); fastsgd reads a dataset whole, once")
        return out
    return [data[i] for i in range(len(data))]


def _iterated(data: Any, name: str) -> Iterable[Any]:
    try:
        return iter(data)
    except TypeError:
        raise UserError(f"the torch dataset {name} is neither map-style (__len__ and "
                        "__getitem__) nor iterable (__iter__)") from None


def _stacked(values: list[Any], name: str, what: str) -> Tensor:
    try:
        return torch.stack([torch.as_tensor(v) for v in values])
    except (RuntimeError, TypeError) as e:
        raise UserError(f"the torch dataset {name}: its samples' {what} do not stack into "
                        f"one tensor ({str(e).splitlines()[0]})") from None


def _windows(samples: list[Tensor], held: list[bool], name: str) -> Dataset:
    """Token windows: integer tensors of one length, at least 2 tokens."""
    x = _stacked(samples, name, "token windows")
    if x.dim() != 2 or x.is_floating_point() or x.shape[1] < 2:
        raise UserError(f"the torch dataset {name} yields tensors of shape "
                        f"{tuple(x.shape[1:])} and type {str(x.dtype)[6:]}; a sample that is "
                        "one tensor must be a window of at least 2 integer token ids")
    keep = torch.tensor([not h for h in held])
    vocab = int(x.max()) + 1
    zeros = torch.zeros(len(x), dtype=torch.uint8)
    return Dataset(name, x[keep], zeros[keep], x[~keep], zeros[~keep], vocab, kind="tokens",
                   default_steps=DEFAULT_STEPS)
