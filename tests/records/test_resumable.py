"""What a resume may do to a finished run (resumable.py): one without a checkpoint has
nothing to train on from."""

import json

import pytest
import torch

from fastsgd.errors import UserError
from fastsgd.records import checkpoint
from fastsgd.records.resumable import check_has_checkpoint, check_not_finished, finished_steps


def _finished(run_dir, steps=3):
    (run_dir / "summary.json").write_text(json.dumps({"strategy": "allreduce", "steps": steps}))


def _checkpoint(run_dir, step):
    digest = checkpoint.save_worker(run_dir, step, 0, {"x": torch.zeros(1)}).hex()
    checkpoint.commit(run_dir, step, [digest], keep=5)


def test_a_finished_run_without_a_checkpoint_says_to_start_a_new_run(tmp_path):
    _finished(tmp_path)
    with pytest.raises(UserError, match=rf"^{tmp_path} has finished \(3 steps\) and has no "
                       r"checkpoint to train on from: to train longer, start a new run"):
        check_has_checkpoint(tmp_path)


def test_a_finished_run_with_a_checkpoint_or_an_unfinished_one_may_resume(tmp_path):
    check_has_checkpoint(tmp_path)  # not finished
    _finished(tmp_path)
    _checkpoint(tmp_path, 2)
    check_has_checkpoint(tmp_path)
    with pytest.raises(UserError, match=r"has finished: its 3 steps are done; to train on, "
                       r"resume with more \(--set run.steps=6, say\)"):
        check_not_finished(tmp_path, 3)
    check_not_finished(tmp_path, 6)


@pytest.mark.parametrize("text", ["[3]", '{"steps": "3"}', '{"steps": true}', "{", "null",
                                  '{"strategy": "allreduce"}'])
def test_a_summary_that_is_not_ours_is_not_a_finished_run(tmp_path, text):
    (tmp_path / "summary.json").write_text(text)
    assert finished_steps(tmp_path) is None
    check_has_checkpoint(tmp_path)
    check_not_finished(tmp_path, 3)
