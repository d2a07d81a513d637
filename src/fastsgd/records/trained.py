"""A finished run's GPT, and text drawn from it (`fastsgd sample RUN_DIR`, Result.sample):
the first look a practitioner takes at a language model, beside its validation loss."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from fastsgd.config.toml_files import read_toml
from fastsgd.errors import UserError
from fastsgd.workloads.gpt import GPT, generate

MAX_TOKENS = 100_000


def trained_gpt(run_dir: Path) -> tuple[GPT, str]:
    """The built-in GPT a finished run trained (model.pt), and its data's kind: "text"
    (bytes) or "tokens" (ids); one line naming the run where it has none."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.toml").is_file():
        raise UserError(f"{run_dir} is not a run directory (no config.toml)")
    config = read_toml(run_dir / "config.toml")
    name = config.get("model", {}).get("name")
    if name != "gpt":
        raise UserError(f"{run_dir} trained model.name = '{name}': fastsgd samples the "
                        "built-in GPT (model.name = 'gpt'); load its model.pt into your own "
                        "model with torch.load(PATH, weights_only=True)")
    if not (run_dir / "model.pt").is_file():
        raise UserError(f"{run_dir} has no model.pt: the run has not finished (go on with "
                        f"fastsgd run --resume {run_dir})")
    state = torch.load(run_dir / "model.pt", weights_only=True, map_location="cpu")
    section = config["model"]
    model = GPT(state["tokens.weight"].shape[0], section["context"], section["layers"],
                section["heads"], section["width"])  # no dropout: it only samples
    model.load_state_dict(state)
    summary = run_dir / "summary.json"
    kind = json.loads(summary.read_text()).get("data_kind") if summary.is_file() else None
    return model.float(), kind or config["data"]["name"]


def sample(run_dir: str | Path, prompt: str = "", tokens: int = 200,
           temperature: float = 0.8, top_k: int = 0, seed: int = 0) -> str:
    """`prompt` and `tokens` more drawn from the run's GPT, as text (byte-level runs: the
    bytes decoded, a broken UTF-8 sequence as U+FFFD) or as ids (token runs: `prompt` is
    ids too, e.g. "464 2068"). The same seed gives the same text."""
    _check(tokens, temperature, top_k)
    model, kind = trained_gpt(Path(run_dir))
    vocab = model.tokens.num_embeddings
    ids = _encoded(prompt, kind, vocab, run_dir)
    out = generate(model, ids, tokens, temperature, top_k,
                   torch.Generator().manual_seed(seed))
    if kind == "text":
        return bytes(out.tolist()).decode("utf-8", errors="replace")
    return " ".join(map(str, out.tolist()))


def _check(tokens: int, temperature: float, top_k: int) -> None:
    if not 1 <= tokens <= MAX_TOKENS:
        raise UserError(f"--tokens {tokens}: draw 1 to {MAX_TOKENS} tokens")
    if not temperature >= 0:
        raise UserError(f"--temperature {temperature}: must be >= 0 (0: the likeliest token)")
    if top_k < 0:
        raise UserError(f"--top-k {top_k}: must be >= 0 (0: every token)")


def _encoded(prompt: str, kind: str, vocab: int, run_dir: Any) -> torch.Tensor:
    """The prompt's token ids: its UTF-8 bytes (a newline where it is empty), or the ids
    it lists for a run on token ids."""
    if kind == "text":
        return torch.tensor(list(prompt.encode() or b"\n"), dtype=torch.long)
    words = re.split(r"[\s,]+", prompt.strip())
    if not prompt.strip() or not all(w.isdigit() for w in words):
        raise UserError(f"{run_dir} was trained on token ids: give the prompt as ids, e.g. "
                        f"--prompt '{vocab // 3} {vocab // 2}'; got {prompt!r}")
    ids = [int(w) for w in words]
    if max(ids) >= vocab:
        raise UserError(f"prompt id {max(ids)} is beyond the model's vocabulary of {vocab}")
    return torch.tensor(ids, dtype=torch.long)
