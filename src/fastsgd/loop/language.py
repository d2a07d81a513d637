"""The default iteration and evaluation of a language model (data.name = text | tokens):
each window of context + 1 tokens gives the model its first context tokens and scores its
logits against the next ones (cross-entropy per token, in nats)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from fastsgd.errors import UserError
from fastsgd.frameworks.base import model_loss_step
from fastsgd.loop.plan import Batch, cross_entropy_step, evaluate_classifier, kept_modes
from fastsgd.loop.regression import evaluate_mse, mse_step
from fastsgd.workloads.data import test_batches
from fastsgd.workloads.dataset import Dataset
from fastsgd.workloads.gpt import GPT, parameter_count
from fastsgd.workloads.kinds import REGRESSION

EVAL_BATCH = 32  # windows per evaluation forward


def next_token_step(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Mean cross-entropy of the next token over the batch's windows."""
    ids = batch[0].long()
    logits = _logits(model(ids[:, :-1]), ids, "step")
    return F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())


@torch.no_grad()
def evaluate_next_token(model: torch.nn.Module, dataset: Dataset,
                        device: torch.device) -> tuple[float, float]:
    """(next-token accuracy, mean cross-entropy per token) on the validation windows."""
    correct, loss, count = 0, 0.0, 0
    with kept_modes(model):
        model.eval()
        for x, _ in test_batches(dataset.test_x, dataset.test_y, EVAL_BATCH):
            ids = x.to(device).long()
            logits = _logits(model(ids[:, :-1]), ids, "evaluate")
            logits, targets = logits.flatten(0, 1).float(), ids[:, 1:].flatten()
            correct += int((logits.argmax(1) == targets).sum())
            loss += float(F.cross_entropy(logits, targets, reduction="sum"))
            count += len(targets)
    return correct / count, loss / count


def _logits(out: object, ids: torch.Tensor, which: str) -> torch.Tensor:
    """The logits in a model's output: the tensor itself, or the first of a tuple (nanoGPT's
    (logits, loss)), or a mapping's or an object's `logits` (Hugging Face's outputs)."""
    if isinstance(out, (tuple, list)) and out:
        out = out[0]
    elif isinstance(out, dict) and "logits" in out:
        out = out["logits"]
    elif not isinstance(out, torch.Tensor) and isinstance(getattr(out, "logits", None),
                                                         torch.Tensor):
        out = out.logits
    b, t = ids.shape[0], ids.shape[1] - 1
    if not (isinstance(out, torch.Tensor) and out.ndim == 3 and tuple(out.shape[:2]) == (b, t)):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise UserError(f"the default {which} of a language model needs a model returning "
                        f"logits of shape (batch, tokens, vocabulary) = ({b}, {t}, V); this "
                        f"one returned {got}: pass {which}=")
    return out


def for_data(fn: Callable[..., Any], dataset: Dataset) -> Callable[..., Any]:
    """The default step or evaluation for `dataset`: model.step = "cross_entropy" and
    model.evaluate = "accuracy" score the next token on text and tokens, the class on
    images, the squared error on a regression's targets; any other (the user's) as it is."""
    if dataset.kind == "images":
        return fn
    if dataset.kind == REGRESSION:
        return {cross_entropy_step: mse_step, evaluate_classifier: evaluate_mse}.get(fn, fn)
    return {cross_entropy_step: next_token_step,
            evaluate_classifier: evaluate_next_token}.get(fn, fn)


def step_for_data(step: Callable[..., Any], dataset: Dataset) -> Callable[..., Any]:
    """for_data's step; a user's on tokens takes its windows as int64 ids (_with_ids), not
    one whose model brings its loss and takes the data as it is (JAX, a packed job)."""
    chosen = for_data(step, dataset)
    if dataset.kind in ("images", REGRESSION) or chosen is not step or step is model_loss_step:
        return chosen
    return _with_ids(step)


def _with_ids(step: Callable[..., Any]) -> Callable[..., Any]:
    """A user's step on tokens gets its windows as int64 ids, as nanoGPT's get_batch gives
    them (held as uint8 or int32 to save memory): embeddings and cross_entropy want them."""
    def step_on_ids(model: torch.nn.Module, batch: Batch) -> Any:
        return step(model, (batch[0].long(), *batch[1:]))
    return step_on_ids


def gpt_factory(section: dict[str, Any], dataset: Dataset) -> Callable[[], torch.nn.Module]:
    """model.name = "gpt" (gpt.py) sized by the [model] section, for `dataset`'s tokens;
    built once here, so that a bad size fails in one line before any worker starts."""
    name = section["name"]
    if dataset.kind == REGRESSION:
        raise UserError(f"model.name = '{name}' is a built-in model of images or tokens; "
                        f"'{dataset.name}' holds a regression's targets: give a model of "
                        "your own (model=)")
    if name != "gpt":
        raise UserError(f"model.name = '{name}' takes images; data.name = '{dataset.name}' "
                        "holds tokens: set model.name = 'gpt', or give a model of your own")
    if dataset.kind == "images":
        raise UserError(f"model.name = 'gpt' takes text or tokens (data.name); "
                        f"'{dataset.name}' holds images")
    sizes = {k: section[k] for k in ("context", "layers", "heads", "width", "dropout")}

    def make() -> torch.nn.Module:
        return GPT(dataset.num_classes, **sizes)

    with torch.random.fork_rng(devices=[]):  # the run's random draws stay as they were
        made = make()
    print(f"fastsgd: gpt, {parameter_count(made) / 1e6:.2f}M parameters ({sizes['layers']} "
          f"layers, width {sizes['width']}, {sizes['heads']} heads, context "
          f"{sizes['context']}, vocabulary {dataset.num_classes})", flush=True)
    return make
