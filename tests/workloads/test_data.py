"""Tests for fastsgd.workloads.data: IDX reading, dataset loading and deterministic sharding."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from fastsgd.errors import UserError
from fastsgd.workloads import data
from fastsgd.workloads.data import Shard, load_dataset
from tests.workloads.test_idx import write_idx

FASHION = Path(data.FASHION_MNIST_PATH)


def make_idx_folder(folder: Path, gz: bool = True) -> Path:
    """A tiny MNIST-like IDX folder: 40 train and 12 test 6x5 images, 3 classes."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if gz else ""
    for split, n in (("train", 40), ("t10k", 12)):
        images = rng.integers(0, 256, size=(n, 6, 5), dtype=np.uint8)
        labels = (np.arange(n) % 3).astype(np.uint8)
        write_idx(folder / f"{split}-images-idx3-ubyte{suffix}", images, gz)
        write_idx(folder / f"{split}-labels-idx1-ubyte{suffix}", labels, gz)
    return folder


@pytest.mark.parametrize("gz", [False, True])
def test_load_idx_folder(tmp_path: Path, gz: bool) -> None:
    ds = load_dataset("idx", path=str(make_idx_folder(tmp_path / "mini", gz)))
    assert ds.name == "idx"
    assert ds.train_x.shape == (40, 1, 6, 5) and ds.test_x.shape == (12, 1, 6, 5)
    assert ds.train_x.dtype == torch.float32 and ds.train_y.dtype == torch.int64
    assert ds.input_shape == (1, 6, 5) and ds.num_classes == 3
    assert abs(float(ds.train_x.mean())) < 1e-4
    assert abs(float(ds.train_x.std()) - 1.0) < 1e-3


def test_load_idx_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="data.path"):
        load_dataset("idx")
    folder = make_idx_folder(tmp_path / "mini")
    (folder / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(UserError, match="t10k-labels-idx1-ubyte"):
        load_dataset("idx", path=str(folder))


def test_a_label_byte_far_outside_the_others_is_named(tmp_path: Path) -> None:
    folder = make_idx_folder(tmp_path / "mini", gz=False)
    labels = (np.arange(40) % 3).astype(np.uint8)
    labels[17] = 200  # one flipped byte: not a 201-class dataset
    write_idx(folder / "train-labels-idx1-ubyte", labels, False)
    with pytest.raises(UserError, match=r"train-labels-idx1-ubyte: label 200 \(at index 17\) is "
                                        r"far outside the others \(0 to 2\)"):
        load_dataset("idx", path=str(folder))


def test_missing_fashion_mnist(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="apt-get install dataset-fashion-mnist") as info:
        load_dataset("fashion_mnist", path=str(tmp_path / "empty"))
    assert str(tmp_path / "empty") in str(info.value)


def test_unknown_dataset() -> None:
    with pytest.raises(UserError, match="'foo'.*data.name.*digits, fashion_mnist, idx, synthetic"):
        load_dataset("foo")


@pytest.mark.parametrize("name, culprit", [
    ("torch.nn:Linear", "data.name = 'torch.nn:Linear' takes arguments; it must name a "
                        "function making a fastsgd.data.Dataset with no arguments"),
    ("torch:tensor", "data.name = 'torch:tensor': tensor"),  # a built-in: no signature
    ("os:getcwd", "data.name = 'os:getcwd' made str, not a fastsgd.data.Dataset")])
def test_a_dataset_function_that_does_not_make_one_is_one_line(name: str, culprit: str) -> None:
    with pytest.raises(UserError, match="^" + re.escape(culprit)):
        load_dataset(name)


@pytest.mark.parametrize("name", ["digits", "synthetic"])
def test_builtin_datasets_deterministic(name: str) -> None:
    a, b, c = load_dataset(name, seed=1), load_dataset(name, seed=1), load_dataset(name, seed=2)
    assert a.input_shape == (1, 8, 8) and a.num_classes == 10
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    assert not torch.equal(a.train_x, c.train_x)


def test_builtin_dataset_sizes() -> None:
    digits = load_dataset("digits")
    assert len(digits.train_x) + len(digits.test_x) == 1797
    assert len(digits.test_x) == round(0.2 * 1797) and len(digits.train_y) == len(digits.train_x)
    synth = load_dataset("synthetic")
    assert synth.train_x.shape == (2048, 1, 8, 8) and synth.test_x.shape == (512, 1, 8, 8)
    assert len(torch.unique(synth.train_y)) == 10


def test_digits_are_scikit_learns_read_without_importing_it() -> None:
    """The file scikit-learn ships, read as its `load_digits` reads it, without importing
    scikit-learn (seconds of scipy in every process that starts a run)."""
    import subprocess
    import sys

    code = ("import sys; from fastsgd.workloads.data import load_dataset; load_dataset('digits'); "
            "print('sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
    from sklearn.datasets import load_digits

    rows = data._digits_rows()
    digits = load_digits()
    assert np.array_equal(rows[:, :-1].reshape(-1, 8, 8), digits.images)
    assert np.array_equal(rows[:, -1], digits.target)


def _toy(n: int = 1000) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.arange(n, dtype=torch.float32).reshape(n, 1, 1, 1)
    return x, torch.arange(n)


def test_sharding_matches_single_worker() -> None:
    x, y = _toy()
    world, b = 4, 16
    single = Shard(x, y, batch_size=world * b, rank=0, world_size=1, seed=5)
    ranks = [Shard(x, y, batch_size=b, rank=r, world_size=world, seed=5) for r in range(world)]
    assert single.steps_per_epoch == ranks[0].steps_per_epoch == 1000 // 64
    epochs = []
    for step in range(2 * single.steps_per_epoch + 1):
        parts = [shard.batch(step) for shard in ranks]
        gx, gy = single.batch(step)
        assert torch.equal(torch.cat([p[0] for p in parts]), gx)
        assert torch.equal(torch.cat([p[1] for p in parts]), gy)
        assert all(len(p[1]) == b for p in parts)
        assert len(torch.unique(gy)) == world * b  # ranks never overlap
        epochs.append(gy)
    seen = torch.cat(epochs[: single.steps_per_epoch])
    assert len(torch.unique(seen)) == len(seen)  # no sample twice within an epoch
    assert not torch.equal(epochs[0], epochs[single.steps_per_epoch])  # reshuffled


def test_shard_epoch_permutation_is_seeded() -> None:
    x, y = _toy(100)
    shard = Shard(x, y, batch_size=10, rank=0, world_size=1, seed=7)
    perm = torch.randperm(100, generator=torch.Generator().manual_seed(7 + 1))
    assert torch.equal(shard.batch(10 + 3)[1], perm[30:40])
    assert torch.equal(
        shard.batch(2)[1], torch.randperm(100, generator=torch.Generator().manual_seed(7))[20:30]
    )


def test_shards_share_the_data_and_each_epoch_permutation() -> None:
    """Simulated workers share one process: one dataset, one permutation per epoch."""
    x, y = _toy(100)
    shards = [Shard(x, y, batch_size=5, rank=r, world_size=4, seed=3) for r in range(4)]
    assert all(s.x is x and s.y is y for s in shards)
    first = [s._permutation(1) for s in shards]
    assert all(p is first[0] for p in first)
    assert first[0] is not shards[0]._permutation(2)
    assert shards[0]._permutation(1) is first[0]  # kept across epochs a few apart
    served = torch.cat([s.batch(5 + k)[1] for k in range(5) for s in shards])
    assert torch.equal(served.sort().values, y.sort().values)  # epoch 1 covers all once


def test_iterating_a_shard_walks_consecutive_epochs() -> None:
    x, y = _toy(100)
    shard = Shard(x, y, batch_size=8, rank=1, world_size=3, seed=2)
    same = Shard(x, y, batch_size=8, rank=1, world_size=3, seed=2)
    assert len(shard) == shard.steps_per_epoch == 4
    for epoch in range(3):
        batches = list(shard)
        assert len(batches) == 4
        for i, (bx, by) in enumerate(batches):
            ex, ey = same.batch(epoch * 4 + i)
            assert torch.equal(bx, ex) and torch.equal(by, ey)


def test_each_iter_call_takes_the_next_epoch_and_epoch_can_be_set() -> None:
    x, y = _toy(100)
    shard = Shard(x, y, batch_size=10, rank=0, world_size=1, seed=0)
    first, second = iter(shard), iter(shard)  # epochs 0 and 1, even before either starts
    assert torch.equal(next(second)[1], shard.batch(10)[1])
    assert torch.equal(next(first)[1], shard.batch(0)[1])
    shard.epoch = 5  # resume mid-run
    assert torch.equal(next(iter(shard))[1], shard.batch(50)[1])
    assert shard.epoch == 6


def test_steps_per_epoch_and_errors() -> None:
    x, y = _toy(100)
    assert Shard(x, y, batch_size=8, rank=1, world_size=3, seed=0).steps_per_epoch == 4
    with pytest.raises(UserError, match="data.batch_size"):
        Shard(x, y, batch_size=30, rank=0, world_size=4, seed=0)
    with pytest.raises(UserError, match="data.batch_size"):
        Shard(x, y, batch_size=0, rank=0, world_size=1, seed=0)
    with pytest.raises(UserError, match="rank"):
        Shard(x, y, batch_size=1, rank=2, world_size=2, seed=0)


def test_test_batches_cover_everything_in_order() -> None:
    x, y = _toy(25)
    batches = list(data.test_batches(x, y, batch_size=10))
    assert [len(bx) for bx, _ in batches] == [10, 10, 5]
    assert torch.equal(torch.cat([by for _, by in batches]), y)


@pytest.mark.skipif(not FASHION.is_dir(), reason=f"{FASHION} is missing")
def test_fashion_mnist_loads() -> None:
    ds = load_dataset("fashion_mnist")
    assert ds.train_x.shape == (60000, 1, 28, 28) and ds.test_x.shape == (10000, 1, 28, 28)
    assert ds.train_y.shape == (60000,) and ds.num_classes == 10
    assert ds.input_shape == (1, 28, 28)


def test_survivors_split_the_same_global_batches_among_themselves():
    """3 workers of batch 7 lose one, then another: the global batch of 21 is split 11 + 10,
    then 21; every sample of every step is taken exactly once, in order."""
    x, y = torch.arange(100.0).unsqueeze(1), torch.arange(100)
    whole = Shard(x, y, batch_size=21, rank=0, world_size=1, seed=4)
    shard = Shard(x, y, batch_size=7, rank=2, world_size=3, seed=4)
    for count in (2, 1):
        parts = [shard.among(i, count) for i in range(count)]
        for step in (0, 3, 4, 9):  # 4 steps an epoch: 9 is in the third
            taken = torch.cat([p.batch(step)[1] for p in parts])
            assert torch.equal(taken, whole.batch(step)[1])
        assert [len(p.batch(0)[1]) for p in parts] == ([11, 10] if count == 2 else [21])
        assert all(p.steps_per_epoch == 4 for p in parts)


def test_idx_splits_of_other_image_sizes_are_one_line(tmp_path: Path) -> None:
    folder = make_idx_folder(tmp_path / "mini")
    write_idx(folder / "t10k-images-idx3-ubyte.gz", np.zeros((12, 4, 4), np.uint8), gz=True)
    with pytest.raises(UserError, match="IDX images in .*mini differ in size: train 6x5, "
                                        "t10k 4x4"):
        load_dataset("idx", path=str(folder))


def _handmade(synthetic, **changes):
    """A Dataset built by hand from the synthetic one (100 train, 20 test samples), with
    `changes` to its fields."""
    fields = {"name": "mine", "train_x": synthetic.train_x[:100],
              "train_y": synthetic.train_y[:100], "test_x": synthetic.test_x[:20],
              "test_y": synthetic.test_y[:20], "num_classes": 10, **changes}
    return data.Dataset(**fields)


@pytest.mark.parametrize("changes, message", [
    (lambda d: {"train_y": d.train_y[:90]}, "train_x has 100 samples but train_y has 90"),
    (lambda d: {"test_y": d.test_y[:5]}, "test_x has 20 samples but test_y has 5"),
    (lambda d: {"train_x": d.train_x[:100].numpy()},
     "train_x must be a torch.Tensor of shape (N, C, H, W); got a numpy.ndarray"),
    (lambda d: {"test_y": d.test_y[:20].tolist()},
     "test_y must be a torch.Tensor of shape (N,); got a list"),
    (lambda d: {"train_y": d.train_y[:100, None]},
     "train_y must be a torch.Tensor of shape (N,); got shape (100, 1)"),
    (lambda d: {"train_y": d.train_y[:100].float()},
     "train_y is float32; it must hold integer class labels"),
    (lambda d: {"test_x": d.test_x[:20, :, :4, :4]},
     "test_x holds samples of shape (1, 4, 4) but train_x of (1, 8, 8)"),
    (lambda d: {"train_y": d.train_y[:100] + 10}, "train_y holds labels up to 19 but "
                                                  "num_classes is 10"),
    (lambda d: {"test_y": d.test_y[:20] - 1},
     "test_y holds a negative label (-1); labels go from 0 to num_classes - 1 = 9"),
    (lambda d: {"test_x": d.test_x[:0], "test_y": d.test_y[:0]},
     "test_x holds no samples; the test split needs at least one"),
    (lambda d: {"num_classes": 0}, "num_classes must be a positive int; got 0"),
])
def test_a_dataset_made_by_hand_is_checked_in_one_line(synthetic, changes, message) -> None:
    with pytest.raises(UserError) as info:
        _handmade(synthetic, **changes(synthetic))
    assert str(info.value).startswith(f"Dataset 'mine': {message}")
    assert "\n" not in str(info.value)


def test_labels_of_another_integer_dtype_become_int64(synthetic) -> None:
    made = _handmade(synthetic, train_y=synthetic.train_y[:100].int(),
                     test_y=synthetic.test_y[:20].to(torch.uint8))
    assert made.train_y.dtype == made.test_y.dtype == torch.int64
    assert torch.equal(made.train_y, synthetic.train_y[:100])
    assert torch.equal(made.test_y, synthetic.test_y[:20])
    kept = _handmade(synthetic)
    assert kept.train_y.data_ptr() == synthetic.train_y.data_ptr()  # int64: no copy


def test_flat_samples_suit_ones_own_model_but_not_a_built_in_one(synthetic, tmp_path) -> None:
    import fastsgd as fs

    flat = _handmade(synthetic, train_x=synthetic.train_x[:100].reshape(100, 64),
                     test_x=synthetic.test_x[:20].reshape(20, 64))
    options = {"run.steps": 3, "run.workers": 2, "compute.model": "fixed",
               "compute.step_time": "1ms", "data.batch_size": 8}
    with pytest.raises(UserError, match=r"^Dataset 'mine': the built-in models take "
                                        r"floating-point train_x of shape \(N, C, H, W\); "
                                        r"got float32 \(100, 64\)"):
        fs.Job(model="mlp", data=flat, quiet=True,
               options={**options, "run.out": str(tmp_path / "a")}).simulate()
    pixels = _handmade(synthetic, train_x=synthetic.train_x[:100].to(torch.uint8),
                       test_x=synthetic.test_x[:20].to(torch.uint8))
    with pytest.raises(UserError, match=r"models take floating-point train_x .* got uint8"):
        fs.Job(model="mlp", data=pixels, quiet=True,
               options={**options, "run.out": str(tmp_path / "c")}).simulate()
    result = fs.Job(model=lambda: torch.nn.Linear(64, 10), data=flat, quiet=True,
                    options={**options, "run.out": str(tmp_path / "b")}).simulate()
    assert result.summary["steps"] == 3
