"""The IDX file format of MNIST and its kin (raw or gzipped): reading a file, finding a
split's files in a folder, and loading a split as tensors."""

from __future__ import annotations

import gzip
import math
import zlib
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fastsgd.errors import UserError

_GZIP_MAGIC = b"\x1f\x8b"
_IDX_DTYPES = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _read_bytes(path: Path) -> bytes:
    """Return the file's content, decompressed when it starts with the gzip magic bytes."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read IDX file {path}: {exc.strerror or exc}") from exc
    if not raw.startswith(_GZIP_MAGIC):
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise UserError(f"corrupt gzip data in IDX file {path}: {exc}") from exc


def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file (raw or gzipped) into a native-endian numpy array."""
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise UserError(f"not an IDX file (bad magic number): {path}")
    dtype = _IDX_DTYPES.get(data[2])
    if dtype is None:
        raise UserError(f"unsupported IDX dtype code 0x{data[2]:02X} in {path}")
    ndims = data[3]
    header = 4 + 4 * ndims
    if ndims == 0 or len(data) < header:
        raise UserError(f"truncated or invalid IDX header in {path}")
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndims, offset=4))
    expected = math.prod(dims) * dtype.itemsize
    if len(data) - header != expected:
        raise UserError(
            f"IDX payload of {path} has {len(data) - header} bytes, "
            f"expected {expected} for dims {dims}"
        )
    array = np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)
    return array.astype(dtype.newbyteorder("="), copy=True)


def idx_names(split: str, kind: str) -> list[str]:
    """Accepted file names for one IDX file, e.g. train-images-idx3-ubyte[.gz]."""
    suffix = "idx3-ubyte" if kind == "images" else "idx1-ubyte"
    bases = [f"{split}-{kind}-{suffix}", f"{split}-{kind}.{suffix}"]
    return [name for base in bases for name in (base, base + ".gz")]


def find_idx(folder: Path, split: str, kind: str) -> Path | None:
    """Return the path of an IDX file in folder, or None when it is missing."""
    for name in idx_names(split, kind):
        if (folder / name).is_file():
            return folder / name
    return None


def load_idx_split(images: Path, labels: Path) -> tuple[Tensor, Tensor]:
    """Load one split's images (N, rows, cols) and labels (N,) as tensors."""
    x, y = read_idx(images), read_idx(labels)
    if x.ndim != 3:
        raise UserError(f"IDX images {images} must have 3 dims (N, rows, cols), got {x.shape}")
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise UserError(f"IDX labels {labels} must be a 1-dim integer array, got {y.shape}")
    if x.dtype.kind == "f" and not np.isfinite(x).all():  # normalizing would make all NaN
        raise UserError(f"IDX images {images} hold NaN or inf values")
    if len(x) != len(y):
        raise UserError(f"{images} has {len(x)} images but {labels} has {len(y)} labels")
    if len(y) == 0 or y.min() < 0:
        raise UserError(f"IDX labels {labels} are empty or negative")
    _check_no_stray_label(y, labels)
    return torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y.astype(np.int64))


def _check_no_stray_label(y: np.ndarray, labels: Path) -> None:
    """A label far above all the others (more than twice the next) is a damaged byte, not a
    class: it would make the model as many classes wide, silently."""
    values = np.unique(y)
    if len(values) >= 2 and values[-1] > 2 * values[-2] + 1:
        where = int(np.flatnonzero(y == values[-1])[0])
        raise UserError(f"IDX labels {labels}: label {values[-1]} (at index {where}) is far "
                        f"outside the others (0 to {values[-2]}): a damaged file? labels "
                        "number the classes from 0 without gaps")


Split = tuple[Tensor, Tensor]


def load_idx_folder(folder: Path, missing_hint: str | None) -> tuple[Split, Split]:
    """The (images, labels) of the train and t10k splits of an IDX folder; `missing_hint`:
    the message for a missing file (None: one naming it)."""
    splits = []
    for split in ("train", "t10k"):
        files = [find_idx(folder, split, kind) for kind in ("images", "labels")]
        for kind, found in zip(("images", "labels"), files, strict=True):
            if found is None:
                if missing_hint is not None:
                    raise UserError(missing_hint)
                wanted = idx_names(split, kind)[0]
                raise UserError(f"IDX file {wanted}[.gz] not found in {folder} (data.path)")
        splits.append(load_idx_split(files[0], files[1]))
    train, test = ("x".join(map(str, x.shape[2:])) for x, _ in splits)
    if train != test:  # a model takes one input shape
        raise UserError(f"IDX images in {folder} differ in size: train {train}, t10k {test}; "
                        "both splits need the same")
    return splits[0], splits[1]
