"""The default step and evaluation of a language model take the common shapes of a model's
output (nanoGPT's (logits, loss), Hugging Face's .logits), and a user's step on tokens gets
int64 ids, as nanoGPT's get_batch gives them."""

import pytest
import torch
import torch.nn.functional as F

import fastsgd as fs
from fastsgd.errors import UserError
from tests.workloads.test_text import _corpus

OPTIONS = {"run.steps": 3, "run.eval_every": 0, "model.context": 16, "data.batch_size": 4,
           "run.tensorboard": False, "data.name": "text"}


class Logits(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(256, 16)
        self.head = torch.nn.Linear(16, 256)

    def forward(self, ids):
        return self.head(self.embedding(ids))


class NanoGPTStyle(Logits):
    def forward(self, ids, targets=None):
        return super().forward(ids), None


class HuggingFaceStyle(Logits):
    def forward(self, ids):
        return {"logits": super().forward(ids)}


class Returns(Logits):
    def forward(self, ids):
        return "not logits"


def nanogpt_step(model, batch):
    ids = batch[0]
    assert ids.dtype == torch.int64
    logits, _ = model(ids[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())


def _loss(tmp_path, model, **given):
    options = {**OPTIONS, "data.path": str(_corpus(tmp_path / "c")),
               "run.out": str(tmp_path / "run")}
    result = fs.Job(model=model, quiet=True, options=options, **given).simulate(2)
    return result.summary["final_loss"]


@pytest.fixture
def plain(tmp_path_factory):
    return _loss(tmp_path_factory.mktemp("plain"), Logits)


@pytest.mark.parametrize("model, given", [(NanoGPTStyle, {}), (HuggingFaceStyle, {}),
                                          (NanoGPTStyle, {"step": nanogpt_step})])
def test_a_model_of_a_common_shape_trains_as_one_returning_logits(plain, tmp_path, model,
                                                                  given):
    assert _loss(tmp_path, model, **given) == plain


def test_a_model_without_logits_names_the_evaluate_its_default_cannot_score(tmp_path):
    with pytest.raises(UserError, match=r"^the default evaluate of a language model needs .* "
                                        r"this one returned str: pass evaluate="):
        _loss(tmp_path, Returns, step=lambda model, batch: model.head.weight.sum())


class Pairs(torch.utils.data.Dataset):
    """nanoGPT's (x, y) windows, y the shift of x."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        window = torch.arange(i, i + 17) % 256
        return window[:-1], window[1:]


def test_a_dataset_of_shifted_pairs_is_told_to_give_one_window(tmp_path):
    with pytest.raises(UserError, match=r"got shape \(38, 16\) \(for a language model, give "
                                        r"each sample as one tensor of model.context \+ 1"):
        fs.Job(model=Logits, data=Pairs(), options={"run.out": str(tmp_path)})
