"""The job archive (.fsj): one zip a worker trains from without the user's source.

    manifest.json   format and versions, the resolved config, the input signature, the
                    tensors' names, shapes and dtypes, each member's SHA-256
    checksum        SHA-256 of manifest.json
    loss.pt2        the step in training mode (export.py), a torch.export archive
    forward.pt2     the model in eval mode, for evaluation
    tensors.bin     initial parameters, buffers and the RNG state after initialization,
                    raw little-endian bytes in manifest order

Loading never unpickles and evaluates nothing: tensors are raw bytes, and each graph is
checked (validate.py) before torch.export reads it.
"""

from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fastsgd.errors import UserError
from fastsgd.pack.validate import check_program

FORMAT, FORMAT_VERSION = "fastsgd-job", 1
PROGRAMS = ("loss.pt2", "forward.pt2")


@dataclass
class Archive:
    """A loaded job archive: the manifest, the saved graphs and the named tensors."""

    path: Path
    manifest: dict[str, Any]
    programs: dict[str, bytes]
    tensors: dict[str, torch.Tensor]

    @property
    def config(self) -> dict[str, Any]:
        return self.manifest["config"]

    @property
    def signature(self) -> dict[str, Any]:
        return self.manifest["signature"]


def write_archive(path: Path, config: dict[str, Any], signature: dict[str, Any],
                  programs: dict[str, bytes], tensors: dict[str, list[tuple[str, torch.Tensor]]],
                  versions: dict[str, str]) -> None:
    """`tensors`: groups (parameters, buffers, rng) of (name, tensor), kept in order."""
    blob, entries = bytearray(), {}
    for group, named in tensors.items():
        entries[group] = []
        for name, tensor in named:
            data = tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            entries[group].append({"name": name, "shape": list(tensor.shape),
                                   "requires_grad": bool(tensor.requires_grad),
                                   "dtype": str(tensor.dtype).removeprefix("torch."),
                                   "offset": len(blob), "bytes": len(data)})
            blob += data
    members = {**programs, "tensors.bin": bytes(blob)}
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, **versions,
                "byteorder": sys.byteorder, "config": config, "signature": signature,
                "tensors": entries,
                "members": {name: _sha256(data) for name, data in members.items()}}
    text = json.dumps(manifest, indent=1, sort_keys=True).encode()
    _write_zip(path, {"manifest.json": text, "checksum": _sha256(text).encode(), **members})


def _write_zip(path: Path, members: dict[str, bytes]) -> None:
    """The zip at `path`, whole or not at all (UserError naming it if it cannot be)."""
    if path.is_dir():
        raise UserError(f"{path} is a folder: name the archive, e.g. {path / 'job.fsj'}")
    partial = path.with_name(path.name + ".partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # deflated: a stored inner zip would let a cut-short archive read as that inner zip
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
            for name, data in members.items():
                z.writestr(name, data)
        partial.replace(path)
    except OSError as e:
        with suppress(OSError):
            partial.unlink()
        where = f": {e.filename}" if e.filename not in (None, str(partial)) else ""
        raise UserError(f"{path}: cannot write the job archive ({e.strerror}{where})") from None


def read_archive(path: str | Path, versions: dict[str, str]) -> Archive:
    """The archive at `path`, checked: whole, unchanged, of this format and torch version;
    UserError naming the file and the problem otherwise."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"job archive {path} is a folder, not a file fastsgd pack writes")
    if not path.is_file():
        raise UserError(f"job archive {path}: no such file")
    try:
        with zipfile.ZipFile(path) as z:
            names = set(z.namelist())
            if "manifest.json" not in names or "checksum" not in names:
                raise UserError(f"{path} is not a fastsgd job archive (no manifest.json); "
                                "make one with: fastsgd pack")
            text, checksum = z.read("manifest.json"), z.read("checksum").decode()
            if _sha256(text) != checksum:
                raise UserError(f"{path}: checksum mismatch in manifest.json (the file is "
                                "damaged or was changed after fastsgd pack)")
            manifest = json.loads(text)
            _check_versions(path, manifest, versions)
            members = {name: z.read(name) for name in manifest["members"]}
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - zipfile, zlib and json raise many kinds
        raise UserError(f"{path} is truncated or damaged ({type(e).__name__}: {e}); pack it "
                        "again or copy it whole") from None
    for name, data in members.items():
        if _sha256(data) != manifest["members"][name]:
            raise UserError(f"{path}: checksum mismatch in {name} (the file is damaged or was "
                            "changed after fastsgd pack)")
    for name in PROGRAMS:
        why = check_program(members.get(name, b""))
        if why:
            raise UserError(f"{path}: {name} is not a graph fastsgd pack writes: {why}; "
                            "refused unloaded")
    try:
        tensors = _tensors(members["tensors.bin"], manifest["tensors"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise UserError(f"{path}: its tensor table does not match tensors.bin ({e})") from None
    return Archive(path, manifest, {n: members[n] for n in PROGRAMS}, tensors)


def _check_versions(path: Path, manifest: dict[str, Any], versions: dict[str, str]) -> None:
    if manifest.get("format") != FORMAT:
        raise UserError(f"{path} is not a fastsgd job archive (format {manifest.get('format')!r})")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise UserError(f"{path} has archive format {manifest.get('format_version')}; this "
                        f"fastsgd {versions['fastsgd']} reads format {FORMAT_VERSION}: pack it "
                        "again with this version")
    packed, here = manifest.get("torch", "?"), versions["torch"]
    if _major_minor(packed) != _major_minor(here):
        raise UserError(f"{path} was packed with torch {packed}; this machine has torch {here}: "
                        f"install torch {'.'.join(_major_minor(packed))} or pack it again here")
    if manifest.get("byteorder") != sys.byteorder:
        raise UserError(f"{path} was packed on a {manifest.get('byteorder')}-endian machine; "
                        f"this one is {sys.byteorder}-endian")


def _major_minor(version: str) -> tuple[str, ...]:
    return tuple(version.split("+")[0].split(".")[:2])


def _tensors(blob: bytes, entries: dict[str, list[dict]]) -> dict[str, torch.Tensor]:
    out = {}
    for group, items in entries.items():
        for item in items:
            start, size = int(item["offset"]), int(item["bytes"])
            raw = bytearray(blob[start:start + size])
            dtype = getattr(torch, str(item["dtype"]), None)
            if not isinstance(dtype, torch.dtype) or len(raw) != size or start < 0:
                raise ValueError(f"tensor {item['name']}: dtype {item['dtype']!r}, bytes "
                                 f"{start}..{start + size} of {len(blob)}")
            flat = torch.frombuffer(raw, dtype=torch.uint8).view(dtype) if raw else \
                torch.empty(0, dtype=dtype)
            out[f"{group}/{item['name']}"] = flat.reshape(item["shape"])
    return out


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
