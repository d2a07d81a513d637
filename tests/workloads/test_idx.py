"""The IDX file format (fastsgd.workloads.idx)."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from fastsgd.errors import UserError
from fastsgd.workloads.idx import load_idx_split, read_idx

_CODES = {"u1": 0x08, "i1": 0x09, "i2": 0x0B, "i4": 0x0C, "f4": 0x0D, "f8": 0x0E}

def idx_bytes(array: np.ndarray) -> bytes:
    """Encode an array as IDX (big-endian)."""
    code = _CODES[array.dtype.str[1:]]
    header = struct.pack(">BBBB", 0, 0, code, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def write_idx(path: Path, array: np.ndarray, gz: bool = False) -> Path:
    """Write an IDX file, gzipped when `gz`."""
    payload = idx_bytes(array)
    path.write_bytes(gzip.compress(payload) if gz else payload)
    return path


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("dtype", ["u1", "i1", "i2", "i4", "f4", "f8"])
def test_read_idx_round_trip(tmp_path: Path, gz: bool, dtype: str) -> None:
    array = (np.arange(2 * 3 * 4) - 7).reshape(2, 3, 4).astype(dtype)
    got = read_idx(write_idx(tmp_path / "a.idx", array, gz))
    assert got.shape == array.shape
    assert got.dtype == np.dtype(dtype).newbyteorder("=")
    np.testing.assert_array_equal(got, array)


def test_read_idx_detects_gzip_by_magic_not_name(tmp_path: Path) -> None:
    array = np.arange(10, dtype=np.uint8)
    gz_without_suffix = write_idx(tmp_path / "labels", array, gz=True)
    raw_with_suffix = write_idx(tmp_path / "labels.gz", array, gz=False)
    np.testing.assert_array_equal(read_idx(gz_without_suffix), array)
    np.testing.assert_array_equal(read_idx(raw_with_suffix), array)


@pytest.mark.parametrize("gz", [False, True])
def test_read_idx_truncated_payload(tmp_path: Path, gz: bool) -> None:
    payload = idx_bytes(np.zeros((4, 3), dtype=np.float32))[:-5]
    path = tmp_path / "short.idx"
    path.write_bytes(gzip.compress(payload) if gz else payload)
    with pytest.raises(UserError, match="short.idx"):
        read_idx(path)


def test_read_idx_truncated_gzip_stream(tmp_path: Path) -> None:
    path = tmp_path / "cut.gz"
    path.write_bytes(gzip.compress(idx_bytes(np.zeros(100, dtype=np.uint8)))[:-12])
    with pytest.raises(UserError, match="cut.gz"):
        read_idx(path)


@pytest.mark.parametrize(
    "content", [b"\x01\x00\x08\x01\x00\x00\x00\x00", b"\x00\x00\x07\x01\x00\x00\x00\x00", b"\x00"]
)
def test_read_idx_bad_magic(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.idx"
    path.write_bytes(content)
    with pytest.raises(UserError, match="bad.idx"):
        read_idx(path)


def test_read_idx_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="nope.idx"):
        read_idx(tmp_path / "nope.idx")


@pytest.mark.parametrize("dtype", ["f4", "f8"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_float_images_with_nan_or_inf_are_refused(tmp_path: Path, dtype: str, bad: float) -> None:
    images = np.zeros((3, 2, 2), dtype)
    images[1, 0, 1] = bad  # one pixel: normalizing would make every input NaN
    labels = write_idx(tmp_path / "labels", np.arange(3, dtype="u1"))
    path = write_idx(tmp_path / "images", images)
    with pytest.raises(UserError, match=f"^IDX images {path} hold NaN or inf values$"):
        load_idx_split(path, labels)
    x, y = load_idx_split(write_idx(tmp_path / "fine", np.ones((3, 2, 2), dtype)), labels)
    assert x.shape == (3, 1, 2, 2) and y.tolist() == [0, 1, 2]
