"""A transformer language model's training job, on the GPU when there is one.

    python -m examples.gpu.train_lm --steps 300 --layers 2 --d-model 128 \
        --ckpt /path/lm.pt --ckpt-every 50 [--device auto|cpu|cuda] [--seed 0]

The data it makes itself: each sequence follows ``next = (a * token + b) mod vocab`` with
its own (a, b) from a small set, so there is something to learn and the loss falls. Step
N's batch is drawn from a generator seeded by (seed, N) alone, so a job resumed at step N
sees the batches an uninterrupted one would. Deterministic algorithms are on: the same steps
give the same losses, resumed or not.

Its own checkpoint (the unmanaged arm's recoverable point): ``--ckpt`` is written with
``torch.save`` every ``--ckpt-every`` steps (model, optimiser, step; atomically: a temporary
file renamed), and read at start when it is there. stdout, one flushed line per step:

    device=cuda:0 params=... resumed_from=0
    step=1 loss=6.283185
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from examples.gpu.model import Decoder, LmConfig, deterministic, pick_device

RULES = 16  # the (a, b) pairs the sequences follow


def batch(step: int, seed: int, cfg: LmConfig, size: int, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    rules = torch.randint(0, RULES, (size,), generator=gen)
    a, b = 1 + 2 * (rules % 8), rules * 7 + 1
    seq = torch.empty(size, cfg.context + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(0, cfg.vocab, (size,), generator=gen)
    for t in range(cfg.context):
        seq[:, t + 1] = (a * seq[:, t] + b) % cfg.vocab
    return seq.to(device)


def save(path: Path, step: int, model: Decoder, optim: torch.optim.Optimizer) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save({"step": step, "model": model.state_dict(), "optim": optim.state_dict()}, tmp)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt", type=Path)
    p.add_argument("--ckpt-every", type=int, default=50)
    p.add_argument("--step-sleep", type=float, default=0.0, help="pause after each step (s)")
    p.add_argument("--device", default="auto")
    args = p.parse_args(argv)
    deterministic()
    device = pick_device(args.device)
    cfg = LmConfig(args.vocab, args.context, args.layers, args.d_model, args.heads)
    torch.manual_seed(args.seed)
    model = Decoder(cfg).to(device)
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr)
    start = 0
    if args.ckpt is not None and args.ckpt.exists():
        state = torch.load(args.ckpt, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        start = int(state["step"])
    params = sum(x.numel() for x in model.parameters())
    print(f"device={device} params={params} resumed_from={start}", flush=True)
    for step in range(start + 1, args.steps + 1):
        seq = batch(step, args.seed, cfg, args.batch, device)
        logits = model(seq[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, cfg.vocab), seq[:, 1:].reshape(-1)
        )
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        print(f"step={step} loss={loss.item():.6f}", flush=True)
        if args.ckpt is not None and step % args.ckpt_every == 0:
            save(args.ckpt, step, model, optim)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
