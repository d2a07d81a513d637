"""Datasets (IDX files, scikit-learn digits, synthetic, text and token files); the sharding of
their train sets among workers is shard.py's."""

from __future__ import annotations

import gzip
import importlib.util
import inspect
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fastsgd.config.objects import WANTED, check_arguments, is_import_path, resolve
from fastsgd.errors import ConfigError, UserError
from fastsgd.workloads.dataset import Dataset
from fastsgd.workloads.idx import load_idx_folder
from fastsgd.workloads.shard import Shard as Shard  # fs.data.Shard
from fastsgd.workloads.text import (
    BYTES,
    DEFAULT_STEPS,
    load_text,
    load_tokens,
    validation_windows,
    windows,
)

DATASETS = ("digits", "fashion_mnist", "idx", "synthetic", "text", "tokens")
SEEDED_DATASETS = ("digits", "synthetic")  # their split or content depends on the seed
FASHION_MNIST_PATH = "/usr/share/datasets/fashion-mnist"


def _make_dataset(name: str, train: tuple[Tensor, Tensor], test: tuple[Tensor, Tensor]) -> Dataset:
    """Normalize inputs per channel with the train set's mean/std and build a Dataset."""
    train_x = train[0].to(torch.float32, copy=True)
    test_x = test[0].to(torch.float32, copy=True)
    mean = train_x.mean(dim=(0, 2, 3), keepdim=True)
    std = train_x.std(dim=(0, 2, 3), keepdim=True)
    std = torch.where(std > 1e-8, std, torch.ones_like(std))
    train_y, test_y = train[1].long(), test[1].long()
    num_classes = int(max(train_y.max(), test_y.max())) + 1
    return Dataset(
        name=name,
        train_x=train_x.sub_(mean).div_(std),
        train_y=train_y,
        test_x=test_x.sub_(mean).div_(std),
        test_y=test_y,
        num_classes=num_classes,
    )


def _load_idx_folder(name: str, folder: Path, missing_hint: str | None) -> Dataset:
    """Load train/t10k images and labels from an IDX folder."""
    return _make_dataset(name, *load_idx_folder(folder, missing_hint))


def _load_fashion_mnist(path: str | None) -> Dataset:
    """Load Fashion-MNIST from the system dataset folder or from `path`."""
    folder = Path(path or FASHION_MNIST_PATH)
    hint = (
        f"Fashion-MNIST not found in {folder}: install it with "
        "`apt-get install dataset-fashion-mnist` or set data.path to a folder of IDX files"
    )
    return _load_idx_folder("fashion_mnist", folder, hint)


def _load_idx(path: str | None) -> Dataset:
    """Load any IDX folder (MNIST, KMNIST, ...) given by `path`."""
    if not path:
        raise UserError("dataset 'idx' needs data.path set to a folder of IDX files")
    folder = Path(path)
    if not folder.is_dir():
        raise UserError(f"IDX folder not found: {folder} (data.path)")
    return _load_idx_folder("idx", folder, None)


def _random_split(
    x: Tensor, y: Tensor, n_test: int, seed: int
) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """Split (x, y) into train/test with a permutation seeded by `seed`."""
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    test_idx, train_idx = perm[:n_test], perm[n_test:]
    return (x[train_idx], y[train_idx]), (x[test_idx], y[test_idx])


def _load_digits(seed: int) -> Dataset:
    """scikit-learn's 8x8 digits, split 80/20 deterministically by `seed`."""
    rows = _digits_rows()
    x = torch.from_numpy(rows[:, :-1].astype(np.float32)).view(-1, 1, 8, 8)
    y = torch.from_numpy(rows[:, -1].astype(np.int64))
    train, test = _random_split(x, y, round(0.2 * len(x)), seed)
    return _make_dataset("digits", train, test)


def _digits_rows() -> np.ndarray:
    """The digits file scikit-learn ships (64 pixels and the label per row, as its
    `load_digits` reads it), read without importing scikit-learn, which takes seconds
    (scipy.stats) in every process that starts a run."""
    spec = importlib.util.find_spec("sklearn")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            with gzip.open(path, "rt") as f:
                return np.loadtxt(f, delimiter=",")
    from sklearn.datasets import load_digits  # elsewhere: scikit-learn's own reader

    digits = load_digits()
    return np.hstack([digits.data, digits.target[:, None]])


def _load_synthetic(seed: int, n_train: int = 2048, n_test: int = 512) -> Dataset:
    """A learnable 10-class problem: labels from a seeded random linear teacher on 1x8x8."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n_train + n_test, 64, generator=gen)
    weight = torch.randn(64, 10, generator=gen)
    bias = 0.5 * torch.randn(10, generator=gen)
    y = (x @ weight + bias).argmax(dim=1)
    x = x.reshape(-1, 1, 8, 8)
    return _make_dataset("synthetic", (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:]))


def _language(name: str, path: str | None, context: int, dtype: str, vocab: int) -> Dataset:
    """Text (bytes) or token ids as windows of context + 1 tokens (text.py); y unused."""
    if name == "text":
        train, val, about = load_text(path, context)
        vocab = BYTES
    else:
        train, val, about = load_tokens(path, dtype, vocab)
        vocab = about["vocab"]
    train_x = windows(train, context, f"training split of {about['corpus']}")
    test_x = validation_windows(val, context)
    return Dataset(name, train_x, torch.zeros(len(train_x), dtype=torch.uint8), test_x,
                   torch.zeros(len(test_x), dtype=torch.uint8), vocab, kind=name,
                   default_steps=DEFAULT_STEPS, about=about, train_tokens=train)


def load_dataset(name: str, path: str | None = None, seed: int = 0, *, context: int = 128,
                 dtype: str = "uint16", vocab: int = 0) -> Dataset:
    """Load dataset `name` (one of DATASETS); `path` is the IDX folder, the text or the
    token file where relevant; `context`, `dtype` and `vocab` are language models'."""
    loaders = {"fashion_mnist": lambda: _load_fashion_mnist(path), "idx": lambda: _load_idx(path),
               "digits": lambda: _load_digits(seed), "synthetic": lambda: _load_synthetic(seed),
               "text": lambda: _language("text", path, context, dtype, vocab),
               "tokens": lambda: _language("tokens", path, context, dtype, vocab)}
    if name in loaders:
        return replace(loaders[name](), source=(name, path or "", seed))
    if is_import_path(name):  # a user's `module:Name`, called with no arguments
        made = _user_dataset(name)
        if not isinstance(made, Dataset):
            raise UserError(f"data.name = '{name}' made {type(made).__name__}, not a "
                            "fastsgd.data.Dataset")
        return replace(made, source=(name, path or "", seed))
    raise UserError(f"unknown dataset {name!r} (data.name); choose one of: {', '.join(DATASETS)}"
                    ", or module:function for your own")


def _user_dataset(name: str) -> object:
    """What the function at import path `name` makes, called with no arguments."""
    factory = resolve(name, "data.name")
    wanted = f"it must name {WANTED['data.name'][0]}"
    check_arguments(factory, 0, f"data.name = '{name}' takes arguments; {wanted}", ConfigError)
    try:
        return factory()
    except TypeError as e:  # a built-in whose signature cannot be read wants arguments
        if not inspect.isfunction(factory):
            raise ConfigError(f"data.name = '{name}': {e}; {wanted}") from None
        raise


def test_batches(x: Tensor, y: Tensor, batch_size: int = 1000) -> Iterator[tuple[Tensor, Tensor]]:
    """Yield (x, y) evaluation batches in order; the last one may be smaller."""
    if batch_size < 1:
        raise UserError(f"evaluation batch size must be positive, got {batch_size}")
    for start in range(0, len(x), batch_size):
        yield x[start : start + batch_size], y[start : start + batch_size]


test_batches.__test__ = False  # not a pytest test, despite the name
