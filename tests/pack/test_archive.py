"""The job archive: checked on load (checksums, versions, a cut-short file, the data's
signature), each problem one line with exit code 2, and nothing unpickled."""

import json
import pickle
import re
import zipfile

import pytest
import torch

from fastsgd import Job
from fastsgd.cli.main import main
from fastsgd.errors import UserError
from fastsgd.pack import versions
from fastsgd.pack.archive import read_archive
from fastsgd.pack.packed import PackedFactory
from fastsgd.workloads.dataset import Dataset
from fastsgd.workloads.models import build_model


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
    from fastsgd.workloads.models import build_model

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


def _tamper(archive, tmp_path, member, change):
    """A copy of `archive` whose graph `member` went through `change(files) -> files` (its
    inner members by name), with every checksum made right again, as an attacker would."""
    import hashlib
    import io

    with zipfile.ZipFile(archive) as z:
        inner = zipfile.ZipFile(io.BytesIO(z.read(member)))
        files = change({n: inner.read(n) for n in inner.namelist()})
        manifest = json.loads(z.read("manifest.json"))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    data = buffer.getvalue()
    return _rewrite(archive, tmp_path / "bad.fsj", members={member: data}, manifest={
        "members": {**manifest["members"], member: hashlib.sha256(data).hexdigest()}})


def _edit_json(files, key, value):
    """The graph with every `key` in its JSON set to `value`."""
    name = next(n for n in files if n.endswith("models/model.json"))

    def edit(node):
        if isinstance(node, dict):
            return {k: value if k == key else edit(v) for k, v in node.items()}
        return [edit(v) for v in node] if isinstance(node, list) else node

    files[name] = json.dumps(edit(json.loads(files[name]))).encode()
    return files


RAN = "/tmp/fastsgd-test-pack-ran"
EVIL = f"__import__('pathlib').Path('{RAN}').touch()"


@pytest.mark.parametrize("member,change,says", [
    ("loss.pt2", lambda f: {**f, "archive/data/sample_inputs/model.pt": pickle.dumps(print)},
     "pickled example inputs"),
    ("loss.pt2", lambda f: {**f, "archive/data/weights/weight_0": pickle.dumps(print)},
     "unexpected members ['data/weights/weight_0']"),
    ("forward.pt2", lambda f: {**f, "archive/data/weights/model_weights_config.json":
                               b'{"config": {"w": {"use_pickle": true}}}'},
     "weights or constants saved apart"),
    ("loss.pt2", lambda f: _edit_json(f, "expr_str", EVIL), "is not shape arithmetic"),
    ("loss.pt2", lambda f: _edit_json(f, "guards_code", [EVIL]),
     "is not a comparison of sizes"),
    ("forward.pt2", lambda f: _edit_json(f, "target", "os.system"), "is not an ATen operator"),
])
def test_a_graph_made_to_attack_is_refused_unloaded(archive, tmp_path, member, change, says):
    import os

    if os.path.exists(RAN):
        os.remove(RAN)
    bad = _tamper(archive, tmp_path, member, change)
    with pytest.raises(UserError, match="is not a graph fastsgd pack writes") as e:
        PackedFactory(bad, versions())()
    assert says in str(e.value)
    assert not os.path.exists(RAN)


def test_a_damaged_tensor_table_is_one_line(archive, tmp_path):
    manifest = json.loads(zipfile.ZipFile(archive).read("manifest.json"))
    manifest["tensors"]["parameters"][0]["bytes"] = 10 ** 9
    bad = _rewrite(archive, tmp_path / "bad.fsj", manifest={"tensors": manifest["tensors"]})
    with pytest.raises(UserError, match="tensor table does not match tensors.bin"):
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
    (tmp_path / "dir.fsj").mkdir()
    assert f"job archive {tmp_path / 'dir.fsj'} is a folder" in _cli_error(
        capsys, "run", str(tmp_path / "dir.fsj"))


@pytest.mark.parametrize("out, says", [
    ("folder", "folder is a folder: name the archive, e.g. "),
    ("a_file/job.fsj", "a_file/job.fsj: cannot write the job archive (File exists: "),
])
def test_an_archive_that_cannot_be_written_is_one_line_and_no_partial_file(tmp_path, out, says):
    from fastsgd.pack.archive import write_archive

    (tmp_path / "folder").mkdir()
    (tmp_path / "a_file").write_text("")
    with pytest.raises(UserError, match="^" + re.escape(f"{tmp_path}/{says}")):
        write_archive(tmp_path / out, {}, {}, {}, {}, versions())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "folder"]


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


def test_an_archive_is_loaded_once_per_version_of_its_file(tmp_path):
    path = tmp_path / "job.fsj"
    Job(model="mlp", data="synthetic", options={"run.seed": 1}).pack(path)
    first = PackedFactory(path, versions()).archive
    assert PackedFactory(path, versions()).archive is first  # loaded once
    Job(model="mlp", data="synthetic", options={"run.seed": 2}).pack(path)  # packed again
    again = PackedFactory(path, versions()).archive
    assert again is not first and again.config["run"]["seed"] == 2


def test_frozen_parameters_stay_frozen(tmp_path):
    def half_frozen():
        model = build_model("mlp", (1, 8, 8), 10)
        model[1].requires_grad_(False)  # the first layer
        return model

    Job(model=half_frozen, data="synthetic").pack(tmp_path / "job.fsj")
    model = PackedFactory(tmp_path / "job.fsj", versions())()
    assert [p.requires_grad for p in model.parameters()] == [False, False, True, True, True,
                                                             True]


def test_ddp_is_refused_for_a_packed_job(tmp_path, archive):
    with pytest.raises(UserError, match="strategy.name = 'ddp' wraps the model"):
        Job(model="mlp", data="synthetic", strategy="ddp").pack(tmp_path / "job.fsj")
    config = json.loads(zipfile.ZipFile(archive).read("manifest.json"))["config"]
    bad = _rewrite(archive, tmp_path / "bad.fsj", manifest={
        "config": {**config, "strategy": {"name": "ddp"}}})
    with pytest.raises(UserError, match="bad.fsj: strategy.name = 'ddp' wraps the model"):
        Job(config=str(bad))


@pytest.mark.parametrize("key,value", [("optimizer", {"name": "evil:Optimizer"}),
                                       ("model", {"evaluate": "evil:evaluate"})])
def test_an_archive_s_config_names_no_code(archive, tmp_path, key, value):
    config = json.loads(zipfile.ZipFile(archive).read("manifest.json"))["config"]
    bad = _rewrite(archive, tmp_path / "bad.fsj", manifest={
        "config": {**config, key: {**config[key], **value}}})
    with pytest.raises(UserError, match="is the user's Python code"):
        Job(config=str(bad))


def test_a_script_s_job_keeps_its_model(tmp_path, capsys):
    from tests.pack.user_job import write_script

    script = write_script(tmp_path)
    assert main(["pack", str(script), "--set", "model.name=lenet"]) == 2
    assert "--set model.name: the job in" in capsys.readouterr().err


def _swapped(archive, tmp_path):
    """The archive with its two graphs in each other's place, checksums made to match (a
    hand edit, or a tool that mixed two archives up)."""
    with zipfile.ZipFile(archive) as z:
        loss, forward = z.read("loss.pt2"), z.read("forward.pt2")
        members = json.loads(z.read("manifest.json"))["members"]
    sums = {**members, "loss.pt2": members["forward.pt2"], "forward.pt2": members["loss.pt2"]}
    return _rewrite(archive, tmp_path / "swapped.fsj", manifest={"members": sums},
                    members={"loss.pt2": forward, "forward.pt2": loss})


def test_graphs_in_each_others_place_are_one_line(archive, tmp_path, capsys):
    swapped = _swapped(archive, tmp_path)
    err = _cli_error(capsys, "simulate", str(swapped), "--quiet", "--no-report",
                     "--set", "run.steps=2", "--set", f"run.out={tmp_path / 'run'}")
    assert err.startswith(f"fastsgd: error: {swapped}: ")


def test_an_archive_whose_config_has_a_nan_is_one_line(archive, tmp_path, capsys):
    with zipfile.ZipFile(archive) as z:
        config = json.loads(z.read("manifest.json"))["config"]
    config["optimizer"]["lr"] = float("nan")
    edited = _rewrite(archive, tmp_path / "nan.fsj", manifest={"config": config})
    err = _cli_error(capsys, "simulate", str(edited), "--quiet", "--no-report",
                     "--set", f"run.out={tmp_path / 'run'}")
    assert err.startswith(f"fastsgd: error: {edited}: optimizer.lr ")


def test_a_packed_job_packs_again_with_its_own_config(archive, tmp_path):
    """Packing a job whose model is a packed job keeps its graphs and initial tensors and
    takes the new config: it trains as the first archive does under that config."""
    again = Job(options={"model.packed": str(archive), "data.name": "synthetic",
                         "run.workers": 2, "optimizer.lr": 0.01}, quiet=True).pack(
        tmp_path / "again.fsj")
    small = ["--quiet", "--no-report", "--set", "run.steps=4", "--set", "run.eval_every=0"]
    assert main(["simulate", str(again), *small, "--set", f"run.out={tmp_path / 'a'}"]) == 0
    assert main(["simulate", str(archive), *small, "--set", "optimizer.lr=0.01",
                 "--set", f"run.out={tmp_path / 'b'}"]) == 0
    assert (tmp_path / "a" / "model.pt").read_bytes() == (tmp_path / "b" / "model.pt"
                                                          ).read_bytes()
    with zipfile.ZipFile(again) as z:
        assert json.loads(z.read("manifest.json"))["config"]["optimizer"]["lr"] == 0.01


@pytest.mark.parametrize("expression, allowed", [
    ("Mul(Integer(16), Symbol('s17', positive=True, integer=True))", True),  # a GPT's step
    ("Add(Mul(Integer(2), Symbol('s0', positive=True, integer=True)), Integer(1))", True),
    ("Mul(Integer(16), Symbol('s17'), __import__('os'))", False),
    ("Mul.__class__", False),
])
def test_shape_arithmetic_takes_products_and_sums_of_sizes_and_nothing_else(expression,
                                                                              allowed):
    from fastsgd.pack.validate import _check_strings

    assert (_check_strings({"expr_str": expression}) is None) is allowed
