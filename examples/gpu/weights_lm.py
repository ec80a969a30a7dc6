"""The serving engine's weights: a ``gpt2-decoder`` of about the size asked for, with random
values, written as safetensors files (nothing comes from a hub). The ``prepare:`` step of a
plan's serving workload.

    python -m examples.gpu.weights_lm DIR --mb 1024 [--seed 0]

Sizes in MiB of float16 weights; the architecture grows with them (a width from the size,
then as many layers as fit). Files of at most 2 GiB each (``model-0000K-of-0000N``) and an
index naming every tensor's file, as served models ship them; the config is in each file's
metadata. Written atomically (temporary names, fsync, rename); a folder already holding the
same size and seed is kept (``"status": "up to date"``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from examples.gpu.model import Decoder, LmConfig

SHARD_BYTES = 2 << 30
INDEX = "model.safetensors.index.json"
MIN_LAYERS = 4


def config_for(mb: float) -> LmConfig:
    """A decoder of about ``mb`` MiB in float16: the widest (up to 4096) that still has
    four layers or more, then as many layers as the size holds."""
    params = mb * (1 << 20) / 2
    for d_model in (4096, 2048, 1024, 512, 256, 128, 64):
        vocab = 32000 if d_model >= 1024 else 8192 if d_model >= 256 else 2048
        context = 1024 if d_model >= 512 else 256
        fixed = vocab * d_model + context * d_model + 2 * d_model
        layers = round((params - fixed) / (12 * d_model * d_model + 13 * d_model))
        if layers >= MIN_LAYERS or d_model == 64:
            return LmConfig(vocab, context, max(1, layers), d_model, max(1, d_model // 64))
    raise AssertionError("unreachable")


def write(folder: Path, mb: float, seed: int) -> dict[str, object]:
    cfg = config_for(mb)
    stamp = {"mb": str(mb), "seed": str(seed), **cfg.as_metadata()}
    index_path = folder / INDEX
    if index_path.exists() and json.loads(index_path.read_text()).get("metadata") == stamp:
        return {"status": "up to date", "folder": str(folder), **stamp}
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    state = {k: v.to(torch.float16).contiguous() for k, v in Decoder(cfg).state_dict().items()}
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    weight_map = {}
    for k, shard in enumerate(shards, 1):
        name = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        tmp = folder / f".{name}.tmp"
        save_file(shard, str(tmp), metadata=stamp)
        _fsync_rename(tmp, folder / name)
        weight_map.update(dict.fromkeys(shard, name))
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": stamp, "total_size": total, "weight_map": weight_map}
    tmp = folder / f".{INDEX}.tmp"
    tmp.write_text(json.dumps(index))
    _fsync_rename(tmp, index_path)
    return {"status": "written", "folder": str(folder), "bytes": total, **stamp}


def _fsync_rename(tmp: Path, final: Path) -> None:
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, final)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--mb", type=float, default=1024)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.mb <= 0:
        p.error(f"--mb {args.mb}: must be more than 0")
    print(json.dumps(write(args.folder, args.mb, args.seed)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
