"""Where `fastsgd pack` writes: only a name ending in .fsj (the one `fastsgd run` reads as an
archive), never over the script, the config or the archive the job comes from; and a config
that names a packed job by model.packed alone."""

import pytest

from fastsgd import Job
from fastsgd.cli.main import main
from fastsgd.errors import UserError

SCRIPT = ('import fastsgd as fs\n'
          'job = fs.Job(model="mlp", data="synthetic", options={"run.workers": 2})\n')
CONFIG = '[model]\nname = "mlp"\n[data]\nname = "synthetic"\n[run]\nworkers = 2\n'


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    out = tmp_path_factory.mktemp("pack") / "named.fsj"
    Job(model="mlp", data="synthetic", options={"run.workers": 2}).pack(out)
    return out


@pytest.mark.parametrize("source, out, says", [
    ("victim.py", "victim.py", "victim.py: a job archive's name ends in .fsj, which fastsgd "
     "run reads as one; write e.g. victim.fsj"),
    ("cfg.toml", "cfg.toml", "cfg.toml: a job archive's name ends in .fsj, which fastsgd run "
     "reads as one; write e.g. cfg.fsj"),
    ("cfg.toml", "noext", "noext: a job archive's name ends in .fsj, which fastsgd run reads "
     "as one; write e.g. noext.fsj"),
    ("victim.py", ".", ".: a job archive's name ends in .fsj, which fastsgd run reads as one; "
     "write e.g. job.fsj"),
])
def test_pack_writes_only_an_fsj_name(tmp_path, monkeypatch, capsys, source, out, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "victim.py").write_text(SCRIPT)
    (tmp_path / "cfg.toml").write_text(CONFIG)
    assert main(["pack", source, "--out", out]) == 2
    assert capsys.readouterr().err == f"fastsgd: error: {says}\n"
    assert (tmp_path / "victim.py").read_text() == SCRIPT
    assert (tmp_path / "cfg.toml").read_text() == CONFIG
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.toml", "victim.py"]


def test_pack_does_not_write_over_the_archive_its_model_comes_from(archive, monkeypatch):
    monkeypatch.chdir(archive.parent)
    before = archive.read_bytes()
    job = Job(config="named.fsj", quiet=True)
    for out in (archive, "named.fsj", "./named.fsj"):
        with pytest.raises(UserError, match=r"named.fsj is model.packed, the archive this "
                           r"job's model comes from; write the new one to another file"):
            job.pack(out)
    assert archive.read_bytes() == before


def test_model_packed_alone_names_the_packed_job(archive, tmp_path):
    """`[model] packed = ...` without name and step: they are 'packed' (fastsgd keys)."""
    config = tmp_path / "mp.toml"
    config.write_text(f'[model]\npacked = "{archive}"\n[data]\nname = "synthetic"\n')
    job = Job(config=str(config), quiet=True)
    assert (job.config["model"]["name"], job.config["model"]["step"]) == ("packed", "packed")
