"""Language-model data (workloads/text.py) and the GPT (workloads/gpt.py)."""

import json

import numpy as np
import pytest
import torch

import fastsgd
from fastsgd.errors import UserError
from fastsgd.report import text_report
from fastsgd.workloads.data import Shard, load_dataset
from fastsgd.workloads.gpt import GPT, parameter_count
from fastsgd.workloads.text import VALIDATION_WINDOWS


def _corpus(folder, files=6, size=3000):
    folder.mkdir()
    rng = np.random.default_rng(0)
    words = ["def", "return", "self", "import", "class", "for", "in", "if", "(", ")", ":"]
    for i in range(files):
        text = " ".join(rng.choice(words, size // 4))
        (folder / f"f{i}.py").write_text(text[:size] + "\n")
    return folder


def test_text_windows_overlap_by_one_token_and_split_by_file(tmp_path):
    folder = _corpus(tmp_path / "c")
    ds = load_dataset("text", str(folder), context=16)
    assert (ds.kind, ds.num_classes, ds.train_x.shape[1]) == ("text", 256, 17)
    assert torch.equal(ds.train_x[0, -1], ds.train_x[1, 0])  # each token a target once
    about = ds.about
    assert about["files"] == 6 and about["bytes"] == sum(
        len(p.read_bytes()) for p in folder.iterdir())
    assert about["train_tokens"] + about["validation_tokens"] == about["bytes"]
    assert 0 < about["validation_tokens"] < about["bytes"]
    again = load_dataset("text", str(folder), context=16)
    assert again.about == about and torch.equal(again.test_x, ds.test_x)  # deterministic


def test_the_default_corpus_is_the_standard_library():
    ds = load_dataset("text", context=128)
    assert ds.about["files"] > 500 and ds.about["bytes"] > 10_000_000
    assert len(ds.test_x) == VALIDATION_WINDOWS


def _shard(ds, batch, rank=0, world=1, seed=3):
    return Shard(ds.train_x, ds.train_y, batch, rank, world, seed=seed, tokens=ds.train_tokens)


def test_workers_share_the_global_batch_of_one_process(tmp_path):
    ds = load_dataset("text", str(_corpus(tmp_path / "c")), context=8)
    whole = _shard(ds, 8).batch(5)[0]
    parts = [_shard(ds, 2, r, 4).batch(5)[0] for r in range(4)]
    assert torch.equal(torch.cat(parts), whole)


def _starts(shard, stream, epoch):
    """Where each window of `epoch` starts in `stream` (its first context tokens are unique:
    the corpus counts up)."""
    x = torch.cat([shard.batch(epoch * shard.steps_per_epoch + k)[0]
                   for k in range(shard.steps_per_epoch)])
    assert torch.equal(x[:, 1:] - x[:, :-1], torch.ones_like(x[:, 1:]))  # whole windows
    return x[:, 0].long() - int(stream[0])


def test_each_epoch_draws_the_windows_at_fresh_offsets_of_the_stream(tmp_path):
    (tmp_path / "d").mkdir()
    np.arange(3000, dtype=np.uint16).tofile(tmp_path / "d" / "train.bin")
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "d" / "val.bin")
    ds = load_dataset("tokens", str(tmp_path / "d"), context=16)
    shard = _shard(ds, 4)
    first, second = (_starts(shard, ds.train_tokens, e).sort().values for e in (0, 1))
    for starts in (first, second):  # window i starts within [16 i, 16 i + 16)
        assert len(set((starts // 16).tolist())) == len(starts) == 46 * 4
    assert len(set((first % 16).tolist())) > 8  # at every offset, not one phase
    assert not torch.equal(first, second)  # and fresh ones each epoch
    assert torch.equal(_starts(_shard(ds, 4), ds.train_tokens, 1).sort().values, second)
    last = int(first.max()) + 17
    assert last <= len(ds.train_tokens)  # never past the training split
    plain = Shard(ds.train_x, ds.train_y, 4, 0, 1, seed=3)  # no stream: the cut windows
    assert set(_starts(plain, ds.train_tokens, 0).tolist()) <= set(range(0, 3000, 16))


def test_a_stream_that_cannot_hold_the_windows_is_one_line():
    x = torch.arange(40).view(4, 10)
    with pytest.raises(UserError, match=r"tokens of shape \(20,\) cannot be the stream of "
                                        r"\(4, 10\) windows"):
        Shard(x, torch.zeros(4), 2, 0, 1, seed=0, tokens=torch.arange(20))


@pytest.mark.parametrize("case, match", [
    ("empty", r"holds no text"),
    ("latin1", r"f\.py is not UTF-8 text \(byte 1\)"),
    ("short", r"fewer than model\.context \+ 1 = 129"),
    ("missing", r"no file or folder .*nowhere \(data\.path\)"),
    ("stray colon", r"data\.path = '.*c:' has an empty entry \(a stray ':'\)"),
])
def test_bad_text_is_one_line_naming_the_file_or_key(tmp_path, case, match):
    folder = tmp_path / "c"
    folder.mkdir()
    if case == "latin1":
        (folder / "f.py").write_bytes(b"a" + "é".encode("latin-1"))
    elif case == "short":
        (folder / "f.py").write_text("x = 1\n" * 10)
    elif case == "empty":
        (folder / "f.py").write_text("")
    path = {"missing": str(tmp_path / "nowhere"),
            "stray colon": f"{folder}:"}.get(case, str(folder))
    with pytest.raises(UserError, match=match):
        load_dataset("text", path, context=128)


def test_token_files_of_nanogpts_layout(tmp_path):
    (tmp_path / "d").mkdir()
    np.arange(1000, dtype=np.uint16).tofile(tmp_path / "d" / "train.bin")
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "d" / "val.bin")
    ds = load_dataset("tokens", str(tmp_path / "d"), context=16)
    assert (ds.num_classes, int(ds.train_x[1, 0]), ds.train_x.dtype) == (1000, 16, torch.int32)
    with pytest.raises(UserError, match=r"holds token id 999, beyond the vocabulary of 500 "
                                        r"\(data\.vocab\)"):
        load_dataset("tokens", str(tmp_path / "d"), context=16, vocab=500)
    np.arange(10, dtype=np.uint32).tofile(tmp_path / "one.bin")
    with pytest.raises(UserError, match=r"fewer than model\.context \+ 1 = 17"):
        load_dataset("tokens", str(tmp_path / "one.bin"), context=16, dtype="uint32")
    (tmp_path / "odd.bin").write_bytes(b"abc")
    with pytest.raises(UserError, match=r"odd\.bin is 3 bytes, not a whole number of uint16"):
        load_dataset("tokens", str(tmp_path / "odd.bin"))


def test_gpt_ties_its_output_to_the_embedding_and_is_causal():
    torch.manual_seed(0)
    model = GPT(256, context=16, layers=2, heads=2, width=32)
    assert model.head.weight is model.tokens.weight
    ids = torch.randint(0, 256, (2, 16))
    changed = ids.clone()
    changed[:, 10:] = 0
    a, b = model(ids), model(changed)
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-6)  # no token sees the future
    assert parameter_count(model) == sum(p.numel() for p in set(model.parameters()))
    with pytest.raises(UserError, match=r"model\.heads = 3 does not divide model\.width = 32"):
        GPT(256, heads=3, width=32)


def test_gpt_dropout_draws_in_training_only():
    torch.manual_seed(0)
    model = GPT(256, context=16, layers=1, heads=2, width=32, dropout=0.2)
    ids = torch.randint(0, 256, (2, 16))
    assert not torch.equal(model(ids), model(ids))  # two draws
    model.eval()
    assert torch.equal(model(ids), model(ids))
    with pytest.raises(UserError, match=r"model\.dropout = 1\.0 must be in \[0, 1\)"):
        GPT(256, dropout=1.0)


def test_a_simulated_gpt_with_dropout_repeats_bit_for_bit(tmp_path):
    """Dropout draws from torch's generator, which the simulated workers share: the
    simulator computes such steps in its own order (lanes.draws_random), so a run repeats."""
    options = {"model.name": "gpt", "data.name": "text", "data.path": str(_corpus(tmp_path / "c")),
               "model.context": 16, "model.layers": 1, "model.width": 16, "model.heads": 2,
               "model.dropout": 0.1, "run.steps": 6, "run.workers": 3, "data.batch_size": 4,
               "run.eval_every": 0, "compute.model": "fixed", "compute.step_time": "1ms"}
    models = [torch.load(fastsgd.Job(quiet=True, options={**options, "run.out": str(out)})
                         .simulate().run_dir / "model.pt", weights_only=True)
              for out in (tmp_path / "a", tmp_path / "b")]
    assert all(torch.equal(models[0][k], models[1][k]) for k in models[0])
    plain = fastsgd.Job(quiet=True, options={**options, "model.dropout": 0.0,
                                             "run.out": str(tmp_path / "p")}).simulate()
    undropped = torch.load(plain.run_dir / "model.pt", weights_only=True)
    assert not all(torch.equal(models[0][k], undropped[k]) for k in undropped)


@pytest.mark.multiproc
def test_the_gpt_learns_bytes_on_four_workers(tmp_path, capsys):
    job = fastsgd.Job(quiet=True, options={
        "model.name": "gpt", "data.name": "text", "data.path": str(_corpus(tmp_path / "c")),
        "model.context": 32, "model.layers": 1, "model.width": 32, "model.heads": 2,
        "optimizer.name": "adamw", "optimizer.lr": 3e-3, "run.steps": 40,
        "run.eval_every": 20, "run.workers": 4, "data.batch_size": 8,
        "run.out": str(tmp_path / "run")})
    result = job.run()
    assert "0.02M parameters" in capsys.readouterr().out
    evals = [json.loads(line) for line in (result.run_dir / "eval.jsonl").open()]
    assert evals[-1]["loss"] / np.log(2) < 6  # bits per byte; uniform bytes: 8
    assert json.loads((result.run_dir / "data.json").read_text())["files"] == 6
    assert result.summary["target"] is None  # no accuracy target for next bytes
    assert "validation     loss" in text_report(result.run_dir)


class _Windows(torch.utils.data.IterableDataset):
    def __iter__(self):
        text = torch.tensor(list(b"def f(x):\n    return x + 1\n" * 200))
        return iter(text[i:i + 17] for i in range(0, len(text) - 17, 16))


def test_a_torch_dataset_is_read_whole_and_never_replaced_by_the_default(tmp_path):
    pairs = torch.utils.data.TensorDataset(torch.randn(40, 1, 8, 8), torch.arange(40) % 3)
    job = fastsgd.Job(data=pairs, model="mlp", quiet=True,
                      options={"run.steps": 2, "run.workers": 1, "run.out": str(tmp_path / "a")})
    summary = job.simulate().summary
    assert summary["steps"] == 2
    held = fastsgd.Job(data=_Windows(), model="gpt", quiet=True, options={
        "model.context": 16, "model.layers": 1, "model.width": 16, "model.heads": 2,
        "run.steps": 3, "run.workers": 2, "data.batch_size": 4, "run.out": str(tmp_path / "b")})
    assert held.simulate().summary["steps"] == 3
    with pytest.raises(UserError, match=r"^data must be a dataset's name, a fastsgd\.data\."
                                        r"Dataset or a torch dataset .*; got a list"):
        fastsgd.Job(data=[1, 2, 3])


TINY_GPT = {"model.name": "gpt", "data.name": "text", "model.context": 16, "model.layers": 1,
            "model.width": 16, "model.heads": 2, "run.steps": 8, "run.eval_every": 0,
            "run.tensorboard": False, "optimizer.name": "adamw", "optimizer.lr": 0.01,
            "optimizer.clip_norm": 0.5, "optimizer.schedule": "cosine",
            "optimizer.warmup": 2, "run.accumulate": 2}


@pytest.mark.multiproc
@pytest.mark.parametrize("mode", ["run", "simulate"])
def test_allreduce_on_the_gpt_equals_one_process_with_the_kit(mode, tmp_path):
    """4 workers, clipping, accumulation 2 and warmup-cosine: one process with the global
    batch (4 workers x 2 micro-batches x 2 windows) to 1e-5."""
    path = str(_corpus(tmp_path / "c"))

    def params(out, **options):
        job = fastsgd.Job(quiet=True, options={**TINY_GPT, "data.path": path,
                                               "run.out": str(tmp_path / out), **options})
        result = job.run() if mode == "run" else job.simulate()
        return torch.load(result.run_dir / "model.pt", weights_only=True)

    four = params("four", **{"run.workers": 4, "data.batch_size": 2})
    one = params("one", **{"run.workers": 1, "data.batch_size": 16, "run.accumulate": 1})
    assert max(float((four[k] - one[k]).abs().max()) for k in one) < 1e-5
