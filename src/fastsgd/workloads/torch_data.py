"""A torch dataset given to the Python API (`Job(data=...)`), map-style or iterable, read
once into a `Dataset`: samples that are (x, y) pairs are a classification set (integer y)
or a regression (floating-point y: a number or a vector per sample); samples
that are one integer tensor each, of one length, are windows of token ids (a language
model's: the model scores each token after the first). Evaluation takes the samples of
`validation=`, or else every HOLD_EVERY-th sample, the same ones in every run."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset as TorchDataset
from torch.utils.data import IterableDataset

from fastsgd.config.objects import described
from fastsgd.errors import UserError
from fastsgd.workloads.dataset import Dataset
from fastsgd.workloads.kinds import REGRESSION
from fastsgd.workloads.text import DEFAULT_STEPS

HOLD_EVERY = 20  # 5% held out
MAX_SAMPLES = 2 ** 24  # an iterable that yields more is taken for an endless stream


def is_torch_dataset(obj: Any) -> bool:
    return isinstance(obj, (TorchDataset, IterableDataset))


def data_argument(data: Any, validation: Any, quiet: bool) -> Any:
    """Job's `data` (a name, a Dataset, a torch dataset, or None) and `validation` (a torch
    dataset beside a torch dataset), checked: a name, a Dataset or None."""
    if is_torch_dataset(data):
        return from_torch(data, validation, quiet)
    if validation is not None:
        raise UserError("validation= goes with a torch dataset given as data=; a fastsgd "
                        "Dataset holds its own validation split (test_x, test_y), and a "
                        "named one has its split built in")
    if not isinstance(data, str | Dataset | None):  # never the default in its place
        raise UserError(f"data must be a dataset's name, a fastsgd.data.Dataset or a "
                        f"torch dataset (map-style or iterable); got {described(data)}")
    return data


def from_torch(data: Any, validation: Any = None, quiet: bool = False) -> Dataset:
    """`data`'s samples as a Dataset (module docstring), evaluated on `validation`'s
    (another torch dataset of the same kind) or, without it, on every HOLD_EVERY-th sample
    of `data`'s, which is said in one line unless `quiet`; or one line saying why not."""
    name = type(data).__name__
    samples = _samples(data, name)
    if not samples:
        raise UserError(f"the torch dataset {name} holds no samples")
    if validation is None:
        held = [i % HOLD_EVERY == HOLD_EVERY - 1 for i in range(len(samples))]
        if len(samples) < 2:
            raise UserError(f"the torch dataset {name} holds 1 sample; at least 2 are "
                            "needed (one is held out for evaluation), or pass validation=")
        if not any(held):
            held[-1] = True
        test = [s for s, h in zip(samples, held) if h]
        samples = [s for s, h in zip(samples, held) if not h]
        about = {"validation": f"{len(test)} samples held out of {name}'s "
                               f"{len(samples) + len(test)} (every {HOLD_EVERY}th)"}
        if not quiet:
            print(f"fastsgd: {about['validation']} for evaluation; pass validation= (a torch "
                  "dataset) to evaluate on your own", flush=True)
    else:
        if not is_torch_dataset(validation):
            raise UserError(f"validation must be a torch dataset (map-style or iterable), "
                            f"as data= is; got {described(validation)}")
        test = _samples(validation, f"{type(validation).__name__} (validation=)")
        if not test:
            raise UserError(f"the validation dataset {type(validation).__name__} holds no "
                            "samples")
        about = {"validation": f"{type(validation).__name__}, {len(test)} samples"}
    return _assembled(name, samples, test, about)


def _assembled(name: str, train: list[Any], test: list[Any], about: dict) -> Dataset:
    """The Dataset of `train`'s and `test`'s samples, which must be of one kind."""
    first = train[0] if train else test[0]
    if isinstance(first, Tensor):
        return _windows(name, _stacked(train, name, "token windows"),
                        _stacked(test, name, "token windows (validation)"), about)
    if not (isinstance(first, (tuple, list)) and len(first) == 2):
        raise UserError(f"the torch dataset {name} yields {type(first).__name__}; fastsgd "
                        "takes samples that are (x, y) pairs or tensors of token ids")
    if not all(isinstance(s, (tuple, list)) and len(s) == 2 for s in test):
        raise UserError(f"the validation dataset's samples are not (x, y) pairs, as "
                        f"{name}'s are")
    x, y = (_stacked([s[i] for s in train], name, what) for i, what in ((0, "x"), (1, "y")))
    tx, ty = (_stacked([s[i] for s in test], name, f"{what} (validation)")
              for i, what in ((0, "x"), (1, "y")))
    if y.is_floating_point():  # targets to fit, not labels
        outputs = 1 if y.dim() == 1 else int(y[0].numel())
        y, ty = (t.reshape(len(t), outputs) if t.dim() > 2 else t for t in (y, ty))
        return Dataset(name, x, y, tx, ty, outputs, kind=REGRESSION, about=about)
    classes = int(max(y.max(), ty.max())) + 1 if len(y) else 1
    return Dataset(name, x, y, tx, ty, classes, about=about)


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


def _windows(name: str, x: Tensor, test: Tensor, about: dict) -> Dataset:
    """Token windows: integer tensors of one length, at least 2 tokens."""
    for windows in (x, test):
        if windows.dim() != 2 or windows.is_floating_point() or windows.shape[1] < 2:
            raise UserError(f"the torch dataset {name} yields tensors of shape "
                            f"{tuple(windows.shape[1:])} and type {str(windows.dtype)[6:]}; a "
                            "sample that is one tensor must be a window of at least 2 "
                            "integer token ids")
    vocab = int(max(x.max(), test.max())) + 1
    return Dataset(name, x, torch.zeros(len(x), dtype=torch.uint8), test,
                   torch.zeros(len(test), dtype=torch.uint8), vocab, kind="tokens",
                   default_steps=DEFAULT_STEPS, about=about)
