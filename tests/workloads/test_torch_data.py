"""A torch dataset given to Job: read whole, evaluated on `validation=` or on a held-out
part of it, which a run says in one line and records in data.json."""

import json

import pytest
import torch

import fastsgd
from fastsgd.errors import UserError
from fastsgd.workloads.torch_data import from_torch


def pairs(n: int, classes: int = 3) -> torch.utils.data.TensorDataset:
    return torch.utils.data.TensorDataset(torch.randn(n, 1, 4, 4), torch.arange(n) % classes)


def windows(n: int, length: int = 9) -> torch.utils.data.TensorDataset:
    return torch.utils.data.TensorDataset(torch.arange(n * length).reshape(n, length) % 50)


class Windows(torch.utils.data.Dataset):  # samples that are one tensor, not a 1-tuple
    def __init__(self, n: int, length: int = 9):
        self.data = torch.arange(n * length).reshape(n, length) % 50

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i]


def test_without_validation_every_20th_sample_is_held_out_and_said(capsys):
    data = from_torch(pairs(100))
    assert (len(data.train_x), len(data.test_x)) == (95, 5)
    assert torch.equal(data.test_y, torch.tensor([19, 39, 59, 79, 99]) % 3)
    said = capsys.readouterr().out
    assert "5 samples held out of TensorDataset's 100 (every 20th) for evaluation" in said
    assert "pass validation=" in said
    from_torch(pairs(100), quiet=True)
    assert capsys.readouterr().out == ""


def test_validation_is_evaluated_on_and_the_training_data_kept_whole(capsys):
    data = from_torch(pairs(60), pairs(7, classes=5))
    assert (len(data.train_x), len(data.test_x), data.num_classes) == (60, 7, 5)
    assert capsys.readouterr().out == ""
    tokens = from_torch(Windows(30), Windows(4, length=9))
    assert (len(tokens.train_x), len(tokens.test_x), tokens.kind) == (30, 4, "tokens")
    assert tokens.about == {"validation": "Windows, 4 samples"}


@pytest.mark.parametrize("validation, message", [
    ([1, 2], r"^validation must be a torch dataset \(map-style or iterable\), as data= is; "
             r"got a list"),
    (pairs(0), r"^the validation dataset TensorDataset holds no samples$"),
    (Windows(3), r"^the validation dataset's samples are not \(x, y\) pairs, as "
                 r"TensorDataset's are$"),
])
def test_a_bad_validation_set_is_one_line(validation, message):
    with pytest.raises(UserError, match=message):
        from_torch(pairs(40), validation)


def test_validation_windows_of_another_length_are_refused_in_one_line():
    with pytest.raises(UserError, match=r"token windows \(validation\) do not stack|shape"):
        from_torch(Windows(30), Windows(4, length=5))
    with pytest.raises(UserError, match=r"^the torch dataset TensorDataset holds no samples$"):
        from_torch(pairs(0), pairs(4))


def test_validation_beside_anything_but_a_torch_dataset_is_refused():
    with pytest.raises(UserError, match=r"^validation= goes with a torch dataset given as "
                                        r"data=; a fastsgd Dataset holds its own"):
        fastsgd.Job(data="digits", validation=pairs(4))


def test_a_job_evaluates_on_its_validation_set_and_records_it(tmp_path):
    val = pairs(7)
    result = fastsgd.Job(data=pairs(40), validation=val, model="mlp", quiet=True, options={
        "run.steps": 2, "run.workers": 2, "data.batch_size": 8,
        "run.out": str(tmp_path / "v")}).simulate()
    recorded = json.loads((result.run_dir / "data.json").read_text())
    assert recorded == {"validation": "TensorDataset, 7 samples"}
    # one of 3 classes at random scores 0, 1/7, ... : a score in sevenths is the 7 samples'
    assert round(result.accuracy * 7, 6) == round(result.accuracy * 7)
