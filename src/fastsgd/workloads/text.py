"""Language-model data: byte-level text (`data.name = "text"`, vocabulary 256) and files of
token ids (`data.name = "tokens"`, the flat uint16/uint32 layout nanoGPT's prepare scripts
write), as a `Dataset` whose samples are windows of `model.context + 1` tokens.

The training split is cut into windows at a stride of `model.context` tokens; every epoch
moves each window's start by a seeded draw in [0, model.context), so windows fall at every
offset of the text as nanoGPT's random windows do, and visits them in a fresh order seeded
by run.seed + epoch, each worker taking its part of every global batch (shard.py), so that
a run on W workers sees the batches of one process with W times the batch. Windows are
strided views of one tensor: a corpus is held once, whatever the number of windows or
workers. Validation is a fixed set of at most VALIDATION_WINDOWS windows spread over the
held-out split, at fixed offsets.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
import zlib
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fastsgd.errors import UserError

BYTES = 256  # the vocabulary of byte-level text
VALIDATION_WINDOWS = 256  # a fixed set: every evaluation sees the same tokens
HELD_OUT = 5  # percent of a corpus's files (or of its one file's tail) held out
DEFAULT_STEPS = 600  # run.epochs = 0: what a language model trains for (minutes on 2 cores)


def stdlib_folder() -> Path:
    """The running Python's standard library: about 30 MB of .py sources on every machine
    with Python, the default corpus."""
    return Path(sysconfig.get_paths()["stdlib"])


def text_files(path: str | None) -> tuple[list[Path], bool]:
    """The files `path` names (files or folders, separated by os.pathsep; a folder: every
    file under it), sorted; by default the standard library's .py files. And whether it
    is the default (whose few files that are not UTF-8, encoding tests, are skipped)."""
    if not path:
        root = stdlib_folder()
        return sorted(p for p in root.rglob("*.py")
                      if "site-packages" not in p.parts and p.is_file()), True
    files: list[Path] = []
    for part in path.split(os.pathsep):
        if not part:  # not the working folder, read whole
            raise UserError(f"data.path = '{path}' has an empty entry (a stray "
                            f"'{os.pathsep}')")
        named = Path(part)
        if named.is_file():
            files.append(named)
        elif named.is_dir():
            files += sorted(p for p in named.rglob("*") if p.is_file())
        else:
            raise UserError(f"no file or folder {named} (data.path)")
    return files, False


def _read_text(files: list[Path], default: bool) -> list[tuple[Path, bytes]]:
    """Each file's bytes, checked to be UTF-8 (a user's file that is not: one line)."""
    out = []
    for file in files:
        data = file.read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            if default:
                continue
            raise UserError(f"{file} is not UTF-8 text (byte {e.start}); data.name = 'text' "
                            "reads UTF-8 files: convert it, or leave it out of data.path") \
                from None
        out.append((file, data))
    return out


def _held_out(file: Path) -> bool:
    """A file's split, by a hash of its name: the same on every machine and every run."""
    return zlib.crc32(file.name.encode() + str(file.parent.name).encode()) % 100 < HELD_OUT


def load_text(path: str | None, context: int) -> tuple[Tensor, Tensor, dict]:
    """The (train, validation) bytes of the corpus `path` names, as uint8 tensors, and
    what it is (files, bytes, sha256) for the run directory."""
    texts = _read_text(*text_files(path))
    where = path or str(stdlib_folder())
    if not any(data for _, data in texts):
        raise UserError(f"the corpus {where} (data.path) holds no text")
    digest = hashlib.sha256()
    for _, data in texts:
        digest.update(data)
    if len(texts) > 1:
        held = [_held_out(f) for f, _ in texts]
        if not any(held) or all(held):  # a few files: the last one is held out
            held = [i == len(texts) - 1 for i in range(len(texts))]
        train = b"".join(d for (_, d), h in zip(texts, held) if not h)
        val = b"".join(d for (_, d), h in zip(texts, held) if h)
    else:
        data = texts[0][1]
        cut = max(len(data) - max(len(data) * HELD_OUT // 100, context + 1), 0)
        train, val = data[:cut], data[cut:]
    about = {"corpus": where, "files": len(texts), "bytes": sum(len(d) for _, d in texts),
             "sha256": digest.hexdigest(), "train_tokens": len(train),
             "validation_tokens": len(val)}
    return _bytes(train), _bytes(val), about


def _bytes(data: bytes) -> Tensor:
    if not data:  # frombuffer refuses an empty buffer
        return torch.zeros(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def load_tokens(path: str | None, dtype: str, vocab: int) -> tuple[Tensor, Tensor, dict]:
    """Token ids from `path`: a folder with train.bin and val.bin, or one file whose last
    HELD_OUT percent is held out; int32 tensors, checked against `vocab` (0: the
    largest id + 1)."""
    if not path:
        raise UserError("data.name = 'tokens' needs data.path: a file of token ids, or a "
                        "folder with train.bin and val.bin")
    named = Path(path)
    if named.is_dir():
        parts = [named / "train.bin", named / "val.bin"]
        missing = [p for p in parts if not p.is_file()]
        if missing:
            raise UserError(f"{missing[0]} not found: data.path = '{path}' is a folder, "
                            "which must hold train.bin and val.bin")
        train, val = (_ids(p, dtype) for p in parts)
    elif named.is_file():
        ids = _ids(named, dtype)
        cut = len(ids) - max(len(ids) * HELD_OUT // 100, 1)
        train, val = ids[:cut], ids[cut:]
    else:
        raise UserError(f"no file or folder {named} (data.path)")
    top = max(int(t.max()) for t in (train, val) if len(t))
    if vocab and top >= vocab:
        raise UserError(f"{path} (data.path) holds token id {top}, beyond the vocabulary of "
                        f"{vocab} (data.vocab)")
    about = {"corpus": str(named), "dtype": dtype, "train_tokens": len(train),
             "validation_tokens": len(val), "vocab": vocab or top + 1}
    return train, val, about


def _ids(file: Path, dtype: str) -> Tensor:
    size = np.dtype(dtype).itemsize
    if file.stat().st_size % size:
        raise UserError(f"{file} is {file.stat().st_size} bytes, not a whole number of "
                        f"{dtype} token ids (data.dtype)")
    ids = np.fromfile(file, dtype=dtype)
    if not len(ids):
        raise UserError(f"{file} (data.path) holds no tokens")
    if dtype == "uint32" and int(ids.max()) >= 2 ** 31:
        raise UserError(f"{file} holds token id {int(ids.max())}, beyond 2**31 - 1")
    return torch.from_numpy(ids.astype(np.int32))


def windows(tokens: Tensor, context: int, what: str) -> Tensor:
    """Windows of context + 1 tokens, overlapping by one: a strided view, no copy."""
    count = (len(tokens) - 1) // context
    if count < 1:
        raise UserError(f"the {what} holds {len(tokens)} tokens, fewer than model.context + "
                        f"1 = {context + 1}: lower model.context or give more text")
    return tokens.as_strided((count, context + 1), (context, 1))


def validation_windows(tokens: Tensor, context: int) -> Tensor:
    """At most VALIDATION_WINDOWS windows, spread evenly over the held-out split."""
    all_windows = windows(tokens, context, "validation split")
    if len(all_windows) <= VALIDATION_WINDOWS:
        return all_windows.clone()
    picked = torch.linspace(0, len(all_windows) - 1, VALIDATION_WINDOWS).long()
    return all_windows.index_select(0, picked)
