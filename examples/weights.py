"""The examples' weights file: a safetensors file that a workload's ``prepare:`` step writes
once and every start reads back, as a production job reads its model from storage.

    python -m examples.weights PATH [--mb 256] [--hidden 64] [--seed 0] [--train-steps 0]

It holds an embedding table ``embed`` (rows × hidden, float32) of about ``--mb`` MiB, looked
up by a hash of each input's pixels (feature hashing, as a recommender's tables are), and,
with ``--train-steps K``, the MLP's weights (``W1``, ``b1``, ``W2``, ``b2``) trained for K
steps with that table: what the serving example loads. The training example loads the table
frozen and trains its MLP on top (a frozen backbone, a trained head).

Written atomically (a temporary file, fsync, rename). A file already there with the same
arguments is kept (``up to date``), so a prepare step that runs before every copy costs a
header read after the first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

FORMAT = "digits-weights-v1"
MIB = 1 << 20
CHUNK_ROWS = 1 << 16  # rows generated (and checksummed) at a time: 16 MiB at hidden 64
MLP_NAMES = ("W1", "b1", "W2", "b2")
# Odd multipliers for the pixel hash, fixed forever (a table's rows must not move).
_HASH_MULT = np.random.Generator(np.random.PCG64(0x5EED_7AB1E)).integers(
    1, 1 << 40, size=64, dtype=np.int64
) | np.int64(1)


def table_rows(mb: float, hidden: int, n_samples: int) -> int:
    """Rows of a table of about ``mb`` MiB; never fewer than the data set has samples."""
    return max(n_samples, int(mb * MIB) // (hidden * 4))


def pixel_rows(X: np.ndarray, rows: int) -> np.ndarray:
    """The table row of each input (X scaled to [0, 1], as the examples hold it)."""
    pixels = np.rint(np.atleast_2d(X) * 16.0).astype(np.int64)
    return (pixels @ _HASH_MULT) % rows


def identity(meta: dict[str, str]) -> str:
    """What a resume checks: the file's arguments (a checkpoint of another table is refused)."""
    keys = ("format", "mb", "hidden", "seed", "train_steps")
    return ",".join(f"{k}={meta.get(k, '')}" for k in keys)


def read_metadata(path: Path) -> dict[str, str] | None:
    try:
        with safe_open(str(path), framework="np") as f:
            return dict(f.metadata() or {})
    except (OSError, SafetensorError):  # absent, truncated or not safetensors
        return None


def load(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Every tensor read into the process's own memory (not a mapping of the file), and the
    metadata; a file of another format is refused."""
    tensors: dict[str, np.ndarray] = {}
    with safe_open(str(path), framework="np") as f:
        meta = dict(f.metadata() or {})
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path}: format {meta.get('format')!r}, expected {FORMAT}")
        for name in f.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
            tensors[name] = np.array(f.get_tensor(name), order="C", copy=True)
    return tensors, meta


def checksum(table: np.ndarray) -> float:
    """A sum over every row, chunk by chunk: reads the whole table (a loader's check)."""
    return float(
        sum(
            float(table[i : i + CHUNK_ROWS].sum(dtype=np.float64))
            for i in range(0, len(table), CHUNK_ROWS)
        )
    )


def make_table(rows: int, hidden: int, seed: int) -> np.ndarray:
    """Uniform values in [-0.1, 0.1), made from PCG64's raw bits (ten times faster than
    normal variates: a 256 MiB table in a fraction of a second)."""
    bitgen = np.random.PCG64([seed, 0xE4BED])
    table = np.empty((rows, hidden), dtype=np.float32)
    for i in range(0, rows, CHUNK_ROWS):
        block = table[i : i + CHUNK_ROWS]
        bits = bitgen.random_raw(block.size // 2 + 1).view(np.uint32)[: block.size]
        # 23 random mantissa bits under the exponent of 1.0: a float32 uniform in [1, 2).
        unit = ((bits >> np.uint32(9)) | np.uint32(0x3F800000)).view(np.float32)
        block[...] = ((unit - np.float32(1.5)) * np.float32(0.2)).reshape(block.shape)
    return table


def write(path: Path, mb: float, hidden: int, seed: int, train_steps: int) -> str:
    """The weights file at ``path`` ('written' or 'up to date')."""
    meta = {
        "format": FORMAT,
        "mb": f"{mb:g}",
        "hidden": str(hidden),
        "seed": str(seed),
        "train_steps": str(train_steps),
    }
    if read_metadata(path) == meta:
        return "up to date"
    from examples.train_digits import Config, DigitsMLP, load_digits_arrays, split_indices

    X, y = load_digits_arrays()
    table = make_table(table_rows(mb, hidden, len(y)), hidden, seed)
    tensors: dict[str, np.ndarray] = {"embed": table}
    if train_steps:
        train_idx, _ = split_indices(len(y))
        model = DigitsMLP(Config(seed=seed, hidden=hidden), X, y, train_idx, embed=table)
        for _ in range(train_steps):
            model.train_step()
        tensors.update({k: model.params[k] for k in MLP_NAMES})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, str(tmp), metadata=meta)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        tmp.chmod(0o644)  # read by the workload's copies, whichever user runs them
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return "written"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m examples.weights", description=__doc__)
    ap.add_argument("path", type=Path)
    ap.add_argument("--mb", type=float, default=256, help="the table's size in MiB (256)")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train-steps", type=int, default=0, help="also train the MLP K steps")
    args = ap.parse_args(argv)
    if args.mb <= 0 or args.hidden < 1 or args.train_steps < 0:
        ap.error("--mb must be > 0, --hidden >= 1 and --train-steps >= 0")
    t0 = time.monotonic()
    what = write(args.path, args.mb, args.hidden, args.seed, args.train_steps)
    size = args.path.stat().st_size
    print(
        json.dumps(
            {
                "path": str(args.path),
                "bytes": size,
                "status": what,
                "seconds": round(time.monotonic() - t0, 3),
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
