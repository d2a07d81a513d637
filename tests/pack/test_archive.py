"""The job archive: checked on load (checksums, versions, a cut-short file, the data's
signature), each problem one line with exit code 2, and nothing unpickled."""

import json
import pickle
import zipfile

import pytest
import torch

from fastsgd import Job
from fastsgd.cli import main
from fastsgd.data import Dataset
from fastsgd.errors import UserError
from fastsgd.pack import packed, versions
from fastsgd.pack.archive import read_archive
from fastsgd.pack.packed import PackedFactory


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    out = tmp_path_factory.mktemp("pack") / "job.fsj"
    Job(model="mlp", data="synthetic", options={"run.workers": 2}).pack(out)
    return out


def _rewrite(src, dst, manifest=None, members=None, checksum=True):
    """A copy of archive `src` with some members replaced (the manifest's checksum kept
    right unless `checksum` is False)."""
    import hashlib

    with zipfile.ZipFile(src) as z:
        files = {n: z.read(n) for n in z.namelist()}
    if manifest is not None:
        data = json.loads(files["manifest.json"])
        data.update(manifest)
        files["manifest.json"] = json.dumps(data).encode()
        if checksum:
            files["checksum"] = hashlib.sha256(files["manifest.json"]).hexdigest().encode()
    files.update(members or {})
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return dst


def _cli_error(capsys, *argv) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line
    return err


def test_a_packed_job_loads_and_starts_from_its_initial_parameters(archive):
    torch.manual_seed(0)
    from fastsgd.models import build_model

    source = build_model("mlp", (1, 8, 8), 10)
    expected_rng = torch.get_rng_state()
    torch.manual_seed(0)
    model = PackedFactory(archive, versions())()
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in source.named_parameters()]
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), source.parameters()))
    assert torch.equal(torch.get_rng_state(), expected_rng)  # where initialization left it


def test_loading_unpickles_nothing(archive, tmp_path, monkeypatch):
    copy = tmp_path / "copy.fsj"
    copy.write_bytes(archive.read_bytes())

    def refuse(*args, **kwargs):
        raise AssertionError("unpickled")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(torch, "load", refuse)
    model = PackedFactory(copy, versions())()
    x = torch.randn(3, 1, 8, 8)
    model.loss(x, torch.tensor([0, 1, 2])).backward()
    assert model(x).shape == (3, 10)


def test_an_archive_holding_a_pickle_is_refused(archive, tmp_path):
    with zipfile.ZipFile(archive) as z:
        inner = z.read("loss.pt2")
    src = tmp_path / "inner.zip"
    src.write_bytes(inner)
    _rewrite(src, tmp_path / "evil.zip", members={
        "archive/data/sample_inputs/model.pt": pickle.dumps(("x", print))})
    evil = (tmp_path / "evil.zip").read_bytes()
    import hashlib

    bad = _rewrite(archive, tmp_path / "bad.fsj", members={"loss.pt2": evil}, manifest={
        "members": {**json.loads(zipfile.ZipFile(archive).read("manifest.json"))["members"],
                    "loss.pt2": hashlib.sha256(evil).hexdigest()}})
    with pytest.raises(UserError, match="holds pickled data"):
        read_archive(bad, versions())


def test_a_changed_member_fails_its_checksum(archive, tmp_path, capsys):
    bad = _rewrite(archive, tmp_path / "bad.fsj", members={"tensors.bin": b"\0" * 100})
    err = _cli_error(capsys, "run", str(bad))
    assert "checksum mismatch in tensors.bin" in err and "bad.fsj" in err


def test_a_changed_manifest_fails_its_checksum(archive, tmp_path, capsys):
    bad = _rewrite(archive, tmp_path / "bad.fsj", manifest={"config": {}}, checksum=False)
    assert "checksum mismatch in manifest.json" in _cli_error(capsys, "simulate", str(bad))


@pytest.mark.parametrize("change,says", [
    ({"torch": "1.13.1"}, "was packed with torch 1.13.1; this machine has torch"),
    ({"format_version": 99}, "has archive format 99"),
    ({"format": "zip"}, "is not a fastsgd job archive"),
])
def test_a_version_mismatch_is_one_line(archive, tmp_path, capsys, change, says):
    bad = _rewrite(archive, tmp_path / "bad.fsj", manifest=change)
    assert says in _cli_error(capsys, "run", str(bad))


def test_a_cut_short_archive_is_one_line(archive, tmp_path, capsys):
    data = archive.read_bytes()
    for size in (0, 10, len(data) // 3, len(data) // 2, len(data) - 1):
        cut = tmp_path / f"cut{size}.fsj"
        cut.write_bytes(data[:size])
        err = _cli_error(capsys, "run", str(cut))
        assert f"cut{size}.fsj" in err and ("truncated or damaged" in err
                                            or "not a fastsgd job archive" in err), err


def test_a_missing_archive_is_one_line(tmp_path, capsys):
    assert "no such file" in _cli_error(capsys, "run", str(tmp_path / "none.fsj"))


def test_data_of_another_shape_is_one_line(archive, capsys):
    err = _cli_error(capsys, "simulate", str(archive), "--data", "fashion_mnist")
    assert "data 'fashion_mnist' has inputs of shape (1, 28, 28)" in err
    assert "job.fsj takes shape (1, 8, 8)" in err


def test_data_of_another_dtype_is_refused(archive, synthetic):
    doubled = Dataset("doubles", synthetic.train_x.double(), synthetic.train_y,
                      synthetic.test_x.double(), synthetic.test_y, synthetic.num_classes)
    with pytest.raises(UserError, match="dtype float64; job.fsj takes .* dtype float32"):
        Job(config=str(archive), data=doubled).simulate()


def test_the_archive_names_the_model_and_the_step(archive):
    with pytest.raises(UserError, match="holds the model and the step: leave model.name out"):
        Job(config=str(archive), options={"model.name": "lenet"})
    with pytest.raises(UserError, match="'packed' needs model.packed"):
        Job(options={"model.name": "packed"})


def test_the_cache_serves_one_load_per_process(archive):
    PackedFactory(archive, versions())()
    assert str(archive.resolve()) in packed._LOADED
