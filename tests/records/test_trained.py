"""Text drawn from a finished run's GPT: `fastsgd sample` and Result.sample."""

import json
import shutil

import pytest

import fastsgd as fs
from fastsgd.cli.main import main
from fastsgd.errors import UserError
from fastsgd.records.trained import sample

LINE = "the cat sat on the mat\n"  # 23 bytes: every phase of it falls in some window of 16


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    corpus = tmp_path_factory.mktemp("corpus")
    (corpus / "cat.txt").write_text(LINE * 400)
    return fs.Job(quiet=True, report=False, options={
        "model.name": "gpt", "data.name": "text", "data.path": str(corpus),
        "model.context": 16, "model.layers": 1, "model.width": 32, "model.heads": 2,
        "run.steps": 200, "run.workers": 1, "data.batch_size": 16, "optimizer.name": "adamw",
        "optimizer.lr": 1e-2, "run.eval_every": 0, "run.tensorboard": False,
        "run.out": str(tmp_path_factory.mktemp("run") / "gpt")}).simulate()


def test_a_trained_gpt_continues_its_text(trained):
    assert trained.loss < 0.2
    assert trained.sample("the cat ", 40, temperature=0) == (LINE * 3)[:48]
    # past model.context the model sees the last 16 bytes only, and goes on alike


def test_the_same_seed_draws_the_same_text_and_top_1_is_the_likeliest(trained):
    drawn = [trained.sample("mat", 30, temperature=2.0, seed=s) for s in (0, 0, 1)]
    assert drawn[0] == drawn[1] != drawn[2]
    assert trained.sample("mat", 30, temperature=2.0, top_k=1) == \
        trained.sample("mat", 30, temperature=0)


def test_the_command_prints_the_prompt_and_what_follows(trained, capsys):
    assert main(["sample", str(trained.run_dir), "--prompt", "the cat ", "--tokens", "15",
                 "--temperature", "0"]) == 0
    assert capsys.readouterr().out == "the cat sat on the mat\n\n"


def test_a_run_on_token_ids_takes_and_gives_ids(trained, tmp_path):
    run = shutil.copytree(trained.run_dir, tmp_path / "tokens")
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "data_kind": "tokens"}))
    ids = [str(b) for b in b"the cat "]
    drawn = sample(run, ", ".join(ids), 4, temperature=0).split()
    assert drawn == [str(b) for b in b"the cat sat "]
    with pytest.raises(UserError, match=r"was trained on token ids: give the prompt as ids, "
                                        r"e\.g\. --prompt '85 128'; got 'the cat'$"):
        sample(run, "the cat")
    with pytest.raises(UserError, match=r"^prompt id 300 is beyond the model's vocabulary "
                                        r"of 256$"):
        sample(run, "3 300")


@pytest.mark.parametrize("args, message", [
    (["--tokens", "0"], "--tokens 0: draw 1 to 100000 tokens"),
    (["--temperature", "-1"], "--temperature -1.0: must be >= 0 (0: the likeliest token)"),
    (["--temperature", "nan"], "--temperature nan: must be >= 0 (0: the likeliest token)"),
    (["--top-k", "-2"], "--top-k -2: must be >= 0 (0: every token)"),
])
def test_bad_options_are_one_line(trained, args, message, capsys):
    assert main(["sample", str(trained.run_dir), *args]) == 2
    assert capsys.readouterr().err == f"fastsgd: error: {message}\n"


def test_a_run_without_the_built_in_gpt_or_unfinished_is_one_line(trained, tmp_path):
    run = shutil.copytree(trained.run_dir, tmp_path / "unfinished")
    (run / "model.pt").unlink()
    with pytest.raises(UserError, match=r"has no model\.pt: the run has not finished \(go on "
                                        r"with fastsgd run --resume .*unfinished\)$"):
        sample(run)
    config = (run / "config.toml").read_text()
    (run / "config.toml").write_text(config.replace('name = "gpt"', 'name = "mlp"'))
    with pytest.raises(UserError, match=r"trained model\.name = 'mlp': fastsgd samples the "
                                        r"built-in GPT"):
        sample(run)
    with pytest.raises(UserError, match=r"nowhere is not a run directory \(no config\.toml\)$"):
        sample(tmp_path / "nowhere")
