"""A decoder-only transformer (GPT-2's shape, Radford et al. 2019) in plain PyTorch: token
and position embeddings, pre-norm blocks of causal self-attention (through
scaled_dot_product_attention) and a 4x GELU MLP, a final LayerNorm and an output layer tied
to the token embedding. Initialised as GPT-2: normal(0, 0.02), the residual projections
scaled by 1/sqrt(2 * layers). Dropout, where set, as nanoGPT places it: on the embeddings,
the attention weights and each residual branch's output, in training only."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fastsgd.errors import UserError


class SelfAttention(nn.Module):
    """Causal multi-head self-attention."""

    def __init__(self, width: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))


class Block(nn.Module):
    """x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, width: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = SelfAttention(width, heads, dropout)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width), nn.Dropout(dropout))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """Next-token logits (B, T, vocab) of token ids (B, T), T <= context."""

    def __init__(self, vocab: int, context: int = 128, layers: int = 4, heads: int = 4,
                 width: int = 128, dropout: float = 0.0) -> None:
        super().__init__()
        if width % heads:
            raise UserError(f"model.heads = {heads} does not divide model.width = {width}")
        if not 0 <= dropout < 1:
            raise UserError(f"model.dropout = {dropout} must be in [0, 1)")
        self.context = context
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(width, heads, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight  # tied (Press & Wolf, 2017)
        self.apply(_init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers))

    def forward(self, ids: Tensor) -> Tensor:
        t = ids.shape[1]
        if t > self.context:
            raise UserError(f"a sequence of {t} tokens is longer than model.context = "
                            f"{self.context}")
        x = self.drop(self.tokens(ids) + self.positions(torch.arange(t, device=ids.device)))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def _init(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, 0.0, 0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def parameter_count(model: nn.Module) -> int:
    """Parameters, each tied one once."""
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def generate(model: GPT, ids: Tensor, new_tokens: int, temperature: float = 0.8,
             top_k: int = 0, generator: torch.Generator | None = None) -> Tensor:
    """`ids` (1-D) followed by `new_tokens` drawn one at a time, each from the model's
    next-token distribution on the last `model.context` tokens: sharpened by `temperature`
    (0: always the likeliest), cut to the `top_k` likeliest (0: all), drawn from
    `generator`. No key-value cache: the models fastsgd trains on a CPU are small."""
    model.eval()
    out = ids.reshape(1, -1)
    for _ in range(new_tokens):
        logits = model(out[:, -model.context:])[0, -1].float()
        if temperature == 0:
            chosen = logits.argmax().reshape(1)
        else:
            logits = logits / temperature
            if 0 < top_k < len(logits):
                logits[logits < logits.topk(top_k).values[-1]] = -math.inf
            chosen = torch.multinomial(logits.softmax(0), 1, generator=generator)
        out = torch.cat([out, chosen.reshape(1, 1)], 1)
    return out[0]
