"""A plain GPT (pre-norm blocks, causal SDPA attention, untied head) for the GPU scripts.

Shared by the tuning's tiny job, the replay recorder and ``benchmarks/gpu/gpu_check.py``, so that the
three measure one model family. ``checkpoint`` wraps each block's call: ``None`` keeps every
activation, ``deepspeed.checkpointing.checkpoint`` recomputes each block in the backward pass.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.out = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).transpose(1, 3).unbind(2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, *, vocab: int, hidden: int, layers: int, heads: int, seq: int,
                 checkpoint: Callable[..., Any] | None = None) -> None:
        super().__init__()
        self.seq = seq
        self.checkpoint = checkpoint
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """The mean next-token loss of ``tokens`` (batch × seq)."""
        x = self.tok(tokens) + self.pos.weight[: tokens.shape[1]]
        for block in self.blocks:
            x = self.checkpoint(block, x) if self.checkpoint is not None else block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits[:, :-1].float().flatten(0, 1), tokens[:, 1:].flatten())


def batch(engine: Any, micro_batch: int, *, vocab: int, seq: int) -> torch.Tensor:
    """Synthetic tokens for one micro-batch on the engine's device."""
    return torch.randint(0, vocab, (micro_batch, seq), device=engine.device)


def param_count(model: nn.Module) -> int:
    """Parameters as the model holds them; under ZeRO-3 a partitioned one counts its full size."""
    return sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
