"""The model both GPU workloads run: a GPT-2-style decoder (token and position embeddings,
pre-norm blocks of causal self-attention and an MLP, a tied output head), written out in
plain tensor operations so that training is deterministic on the GPU too (no fused
attention kernel whose backward pass is not).

The architecture is named ``gpt2-decoder``; its sizes travel with the weights (the
safetensors files' metadata) so a server loads exactly what was written.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass

import torch
from torch import nn

ARCHITECTURE = "gpt2-decoder"


@dataclass(frozen=True)
class LmConfig:
    vocab: int = 512
    context: int = 64
    layers: int = 2
    d_model: int = 128
    heads: int = 4

    def as_metadata(self) -> dict[str, str]:
        return {"architecture": ARCHITECTURE, **{k: str(v) for k, v in asdict(self).items()}}

    @classmethod
    def from_metadata(cls, meta: dict[str, str]) -> LmConfig:
        if meta.get("architecture") != ARCHITECTURE:
            raise ValueError(f"weights of {meta.get('architecture')!r}, not {ARCHITECTURE}")
        return cls(**{k: int(meta[k]) for k in asdict(cls())})

    def parameters(self) -> int:
        d = self.d_model
        return self.vocab * d + self.context * d + self.layers * (12 * d * d + 13 * d) + 2 * d


class Block(nn.Module):
    def __init__(self, cfg: LmConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.up = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.down = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        shape = (b, t, self.heads, d // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        att = att.masked_fill(mask[:t, :t], float("-inf")).softmax(dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.down(nn.functional.gelu(self.up(self.ln2(x))))


class Decoder(nn.Module):
    def __init__(self, cfg: LmConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tokens = nn.Embedding(cfg.vocab, cfg.d_model)
        self.positions = nn.Embedding(cfg.context, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.d_model)
        causal = torch.triu(torch.ones(cfg.context, cfg.context, dtype=torch.bool), diagonal=1)
        self.register_buffer("mask", causal, persistent=False)
        for emb in (self.tokens, self.positions):  # GPT-2's scale: logits start near uniform
            nn.init.normal_(emb.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tokens(idx) + self.positions(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x, self.mask)
        return self.ln(x) @ self.tokens.weight.T  # the head shares the embedding

    @torch.no_grad()
    def generate(self, prompt: list[int], tokens: int) -> list[int]:
        """Greedy continuation: deterministic for given weights."""
        device = self.tokens.weight.device
        idx = torch.tensor([prompt], dtype=torch.long, device=device)
        for _ in range(tokens):
            logits = self(idx[:, -self.cfg.context :])[:, -1, :]
            idx = torch.cat([idx, logits.argmax(dim=-1, keepdim=True)], dim=1)
        return idx[0, len(prompt) :].tolist()


def pick_device(wanted: str) -> torch.device:
    """``auto``: the GPU when there is one, else the CPU."""
    if wanted == "auto":
        wanted = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(wanted)


def deterministic() -> None:
    """Same losses on every run of the same steps (cuBLAS needs its workspace fixed before
    the first CUDA call)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
