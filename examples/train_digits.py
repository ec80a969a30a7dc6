"""A small real training job: a NumPy MLP (64 -> hidden -> 10) on scikit-learn's digits.

    python -m examples.train_digits --steps 300 --checkpoint-every 50 \
        --checkpoint-dir /tmp/digits --resume

Minibatch SGD with momentum on a softmax cross-entropy loss. Everything a step depends on
(weights, momentum buffers, the data-order generator, the current epoch's permutation and
the position in it, the step counter) is kept in one object and written to the application
checkpoint, so a run killed and resumed from its checkpoint at step K prints exactly the
same losses from step K+1 on as an uninterrupted run. Nothing depends on time.

stdout, one flushed line per event (see examples/README.md):

    start steps=300 hidden=64 seed=0 state_mb=0
    resumed step=100                       (only with --resume and a checkpoint present)
    step=101 loss=0.12345678901234567      (one per step; loss is repr(float))
    checkpoint step=150                    (after each checkpoint is in place)
    eval accuracy=0.9722222222222222       (held-out samples, at the end)
    done step=300
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from examples import weights as weights_file

CKPT_NAME = "ckpt.npz"
CKPT_FORMAT = "digits-mlp-v1"
N_FEATURES = 64
N_CLASSES = 10
MIB = 1 << 20


# --------------------------------------------------------------------------- data


def _bundled_digits_csv() -> Path | None:
    """scikit-learn's own copy of the digits data, found without importing scikit-learn.

    ``import sklearn.datasets`` takes seconds and pulls in SciPy (more memory, more shared
    libraries for CRIU to dump); the data itself is a 1797-line gzip'd CSV in the package.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            return path
    return None


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(X, y): X float64 (1797, 64) scaled to [0, 1], y int64 (1797,) in 0..9.

    The same numbers as ``sklearn.datasets.load_digits()`` (data / 16, target).
    """
    path = _bundled_digits_csv()
    if path is not None:
        with gzip.open(path, "rt") as f:
            data = np.loadtxt(f, delimiter=",")
        pixels, target = data[:, :-1], data[:, -1]
    else:
        try:
            from sklearn.datasets import load_digits
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise SystemExit("examples need scikit-learn (for its bundled digits data)") from exc
        bunch = load_digits()
        pixels, target = bunch.data, bunch.target
    if pixels.shape != (1797, N_FEATURES):
        raise RuntimeError(f"unexpected digits data shape {pixels.shape}")
    X = np.ascontiguousarray(pixels, dtype=np.float64) / 16.0
    y = np.ascontiguousarray(target, dtype=np.int64)
    return X, y


def split_indices(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Fixed train/held-out split, independent of the seed: every fifth sample is held out."""
    idx = np.arange(n, dtype=np.int64)
    return idx[idx % 5 != 0], idx[idx % 5 == 0]


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Config:
    seed: int = 0
    hidden: int = 64
    lr: float = 0.05
    momentum: float = 0.9
    batch_size: int = 32
    weights: str = ""  # the weights file's identity (examples/weights.py), if one is read


PARAM_NAMES = ("W1", "b1", "W2", "b2")


class DigitsMLP:
    """Weights, momentum buffers and the data-order generator: all a training step reads."""

    def __init__(
        self,
        cfg: Config,
        X: np.ndarray,
        y: np.ndarray,
        train_idx: np.ndarray,
        embed: np.ndarray | None = None,
    ):
        if not 1 <= cfg.batch_size <= len(train_idx):
            raise ValueError(f"batch size must be in 1..{len(train_idx)}")
        if embed is not None and embed.shape[1:] != (cfg.hidden,):
            raise ValueError(
                f"the table's rows have {embed.shape[1:]} values, hidden is {cfg.hidden}"
            )
        self.cfg = cfg
        self.X, self.y, self.train_idx = X, y, train_idx
        # A frozen embedding table (examples/weights.py), added to the hidden layer's input
        # at each sample's row; none: the plain MLP.
        self.embed = embed
        self.sample_rows = weights_file.pixel_rows(X, len(embed)) if embed is not None else None
        self.rng = np.random.Generator(np.random.PCG64(cfg.seed))
        h = cfg.hidden
        self.params = {
            "W1": self.rng.standard_normal((N_FEATURES, h)) * np.sqrt(2.0 / N_FEATURES),
            "b1": np.zeros(h),
            "W2": self.rng.standard_normal((h, N_CLASSES)) * np.sqrt(2.0 / h),
            "b2": np.zeros(N_CLASSES),
        }
        self.velocity = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.step = 0
        self.epoch = 0
        self.perm = np.zeros(0, dtype=np.int64)
        self.pos = 0

    # -- inference
    def _pre(self, x: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        p = self.params
        pre = x @ p["W1"] + p["b1"]
        if self.embed is not None:
            pre = pre + self.embed[rows]
        return pre

    def logits(self, x: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """Logits of inputs ``x``; ``rows``: their table rows (hashed from ``x`` if None)."""
        x = np.atleast_2d(x)
        if self.embed is not None and rows is None:
            rows = weights_file.pixel_rows(x, len(self.embed))
        hidden = np.maximum(self._pre(x, rows), 0.0)
        p = self.params
        return hidden @ p["W2"] + p["b2"]

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        z = self.logits(np.atleast_2d(x))
        z -= z.max(axis=1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=1, keepdims=True)

    def accuracy(self, idx: np.ndarray) -> float:
        rows = self.sample_rows[idx] if self.sample_rows is not None else None
        pred = self.logits(self.X[idx], rows).argmax(axis=1)
        return float((pred == self.y[idx]).mean())

    # -- training
    def _next_batch(self) -> np.ndarray:
        b = self.cfg.batch_size
        if self.pos + b > len(self.perm):  # new epoch; the last partial batch is dropped
            self.perm = self.rng.permutation(len(self.train_idx))
            self.pos = 0
            self.epoch += 1
        batch = self.train_idx[self.perm[self.pos : self.pos + b]]
        self.pos += b
        return batch

    def train_step(self) -> float:
        """One minibatch SGD-with-momentum step; returns the batch loss before the update."""
        p, cfg = self.params, self.cfg
        batch = self._next_batch()
        x, t = self.X[batch], self.y[batch]
        n = len(batch)
        rows = np.arange(n)

        pre = self._pre(x, self.sample_rows[batch] if self.sample_rows is not None else None)
        hidden = np.maximum(pre, 0.0)
        z = hidden @ p["W2"] + p["b2"]
        z -= z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        loss = -logp[rows, t].mean()

        g = np.exp(logp)
        g[rows, t] -= 1.0
        g /= n
        grads = {"W2": hidden.T @ g, "b2": g.sum(axis=0)}
        dh = g @ p["W2"].T
        dh[pre <= 0.0] = 0.0
        grads["W1"] = x.T @ dh
        grads["b1"] = dh.sum(axis=0)

        for k in PARAM_NAMES:
            v = self.velocity[k]
            v *= cfg.momentum
            v -= cfg.lr * grads[k]
            p[k] += v
        self.step += 1
        return float(loss)

    # -- state
    def state_arrays(self) -> dict[str, np.ndarray]:
        arrays: dict[str, np.ndarray] = {
            "format": np.array(CKPT_FORMAT),
            "config": np.array(json.dumps(asdict(self.cfg), sort_keys=True)),
            "step": np.array(self.step, dtype=np.int64),
            "epoch": np.array(self.epoch, dtype=np.int64),
            "pos": np.array(self.pos, dtype=np.int64),
            "perm": self.perm,
            "rng_state": np.array(json.dumps(self.rng.bit_generator.state)),
        }
        for k in PARAM_NAMES:
            arrays[f"param_{k}"] = self.params[k]
            arrays[f"velocity_{k}"] = self.velocity[k]
        return arrays

    def load_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        if str(arrays["format"]) != CKPT_FORMAT:
            raise ValueError(f"checkpoint format {arrays['format']!s}, expected {CKPT_FORMAT}")
        saved = json.loads(str(arrays["config"]))
        if saved != asdict(self.cfg):
            raise ValueError(
                f"checkpoint was written with {saved}, this run has {asdict(self.cfg)}"
            )
        # Fresh, contiguous copies: the same memory layout as arrays a run made itself.
        for k in PARAM_NAMES:
            self.params[k] = np.array(arrays[f"param_{k}"], dtype=np.float64, order="C")
            self.velocity[k] = np.array(arrays[f"velocity_{k}"], dtype=np.float64, order="C")
        self.step = int(arrays["step"])
        self.epoch = int(arrays["epoch"])
        self.pos = int(arrays["pos"])
        self.perm = np.array(arrays["perm"], dtype=np.int64, order="C")
        self.rng.bit_generator.state = json.loads(str(arrays["rng_state"]))


# --------------------------------------------------------------------------- ballast


class Ballast:
    """``mb`` MiB of incompressible memory, resident (every page written) and kept live.

    Lets a benchmark size the process (what CRIU dumps) independently of the model.
    Held as chunks of at most 64 MiB; ``touch(step)`` rewrites a rotating 1 MiB window.
    """

    CHUNK_U64 = 64 * MIB // 8
    WINDOW_U64 = MIB // 8

    def __init__(self, chunks: list[np.ndarray]):
        self.chunks = chunks
        self.windows_per_chunk = self.CHUNK_U64 // self.WINDOW_U64
        self.n_windows = sum(len(c) for c in chunks) // self.WINDOW_U64

    @classmethod
    def generate(cls, mb: int, seed: int, between_chunks=None) -> Ballast:
        bitgen = np.random.PCG64([seed, 0xBA11A57])
        left = mb * MIB // 8
        chunks = []
        while left > 0:
            n = min(left, cls.CHUNK_U64)
            chunks.append(bitgen.random_raw(n))  # uint64, pages written as generated
            left -= n
            if between_chunks is not None:
                between_chunks()
        return cls(chunks)

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> Ballast | None:
        n = int(arrays.get("ballast_chunks", 0))
        if n == 0:
            return None
        return cls([np.array(arrays[f"ballast_{i}"], dtype=np.uint64) for i in range(n)])

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.chunks)

    def touch(self, step: int) -> None:
        if self.n_windows == 0:
            return
        w = step % self.n_windows
        chunk = self.chunks[w // self.windows_per_chunk]
        start = (w % self.windows_per_chunk) * self.WINDOW_U64
        chunk[start : start + self.WINDOW_U64] += np.uint64(1)

    def state_arrays(self) -> dict[str, np.ndarray]:
        arrays = {f"ballast_{i}": c for i, c in enumerate(self.chunks)}
        arrays["ballast_chunks"] = np.array(len(self.chunks), dtype=np.int64)
        return arrays


# --------------------------------------------------------------------------- checkpoints


def save_checkpoint(directory: Path, arrays: dict[str, np.ndarray]) -> Path:
    """Write ``directory/ckpt.npz`` atomically: a temporary file, fsync, rename, fsync dir.

    The temporary file is open only while it is written (never across a step).
    """
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / CKPT_NAME
    tmp = directory / f".{CKPT_NAME}.tmp"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return final


def load_checkpoint(directory: Path) -> dict[str, np.ndarray] | None:
    path = directory / CKPT_NAME
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


# --------------------------------------------------------------------------- main


def _emit(line: str) -> None:
    print(line, flush=True)


def read_weights(path: Path) -> tuple[dict[str, np.ndarray], str]:
    """Every tensor of ``path`` read into memory, and the file's identity; a missing or
    foreign file, or one without the table, ends the run (exit 2) saying which."""
    t0 = time.monotonic()
    try:
        tensors, meta = weights_file.load(path)
    except (OSError, ValueError, weights_file.SafetensorError) as exc:
        print(f"cannot read weights {path}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if "embed" not in tensors:
        print(f"cannot read weights {path}: no 'embed' tensor", file=sys.stderr)
        raise SystemExit(2)
    size = sum(t.nbytes for t in tensors.values())
    _emit(f"loaded weights bytes={size} read_s={time.monotonic() - t0:.3f}")
    return tensors, weights_file.identity(meta)


def warm_up(model: DigitsMLP) -> None:
    """Before step 1, as an engine builds and checks what it read: the table checked end to
    end and one forward pass over the whole data set."""
    t0 = time.monotonic()
    assert model.embed is not None
    total = weights_file.checksum(model.embed)
    accuracy = model.accuracy(np.arange(len(model.y)))
    _emit(f"warmup checksum={total!r} accuracy={accuracy!r} s={time.monotonic() - t0:.3f}")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m examples.train_digits",
        description="Train a NumPy MLP on scikit-learn's digits; deterministic for --seed.",
    )
    ap.add_argument("--steps", type=int, default=300, help="total steps (default 300)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=64, help="hidden units (default 64)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        metavar="K",
        help="write the application checkpoint every K steps and at the end (0: never)",
    )
    ap.add_argument("--checkpoint-dir", type=Path, help=f"where {CKPT_NAME} lives")
    ap.add_argument(
        "--resume",
        action="store_true",
        help="continue from the checkpoint in --checkpoint-dir if there is one",
    )
    ap.add_argument(
        "--weights",
        type=Path,
        metavar="FILE",
        help="read the frozen embedding table from FILE (python -m examples.weights) and warm "
        "up before step 1: a production job's model read from storage",
    )
    ap.add_argument(
        "--state-mb",
        type=int,
        default=0,
        metavar="M",
        help="keep M MiB of extra ballast memory resident and touched (default 0)",
    )
    ap.add_argument(
        "--checkpoint-ballast",
        action="store_true",
        help="include the ballast in the application checkpoint (its size then scales too)",
    )
    ap.add_argument(
        "--stamp-lines",
        action="store_true",
        # The wall clock: a copy CRIU restored reads CLOCK_MONOTONIC in a time namespace
        # shifted to go on from its dump, not the host's (seen: 0.37 s behind).
        help="end each step line with written_unix_ns=<time.time_ns()> (for testing clocks)",
    )
    ap.add_argument(
        "--step-sleep",
        type=float,
        default=0.02,
        metavar="S",
        help="seconds to sleep after each step (default 0.02)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.steps < 0 or args.hidden < 1 or args.state_mb < 0 or args.checkpoint_every < 0:
        ap.error("--steps, --state-mb and --checkpoint-every must be >= 0, --hidden >= 1")
    if (args.checkpoint_every or args.resume) and args.checkpoint_dir is None:
        ap.error("--checkpoint-every and --resume need --checkpoint-dir")

    X, y = load_digits_arrays()
    train_idx, test_idx = split_indices(len(y))
    embed, identity = None, ""
    if args.weights is not None:
        tensors, identity = read_weights(args.weights)
        embed = tensors["embed"]
    cfg = Config(args.seed, args.hidden, args.lr, args.momentum, args.batch_size, identity)
    try:
        model = DigitsMLP(cfg, X, y, train_idx, embed=embed)
    except ValueError as exc:
        ap.error(str(exc))
    if embed is not None:
        warm_up(model)
    _emit(
        f"start steps={args.steps} hidden={args.hidden} seed={args.seed} state_mb={args.state_mb}"
    )

    ballast = None
    saved_at = -1
    state = load_checkpoint(args.checkpoint_dir) if args.resume else None
    if state is not None:
        try:
            model.load_state_arrays(state)
        except (KeyError, ValueError) as exc:
            print(f"cannot resume from {args.checkpoint_dir / CKPT_NAME}: {exc}", file=sys.stderr)
            return 2
        ballast = Ballast.from_arrays(state)
        if ballast is not None and ballast.nbytes != args.state_mb * MIB:
            ballast = None
        del state
        saved_at = model.step
        _emit(f"resumed step={model.step}")
    if ballast is None and args.state_mb > 0:
        ballast = Ballast.generate(args.state_mb, args.seed)

    def checkpoint() -> None:
        arrays = model.state_arrays()
        if ballast is not None and args.checkpoint_ballast:
            arrays.update(ballast.state_arrays())
        save_checkpoint(args.checkpoint_dir, arrays)
        _emit(f"checkpoint step={model.step}")

    while model.step < args.steps:
        loss = model.train_step()
        if ballast is not None:
            ballast.touch(model.step)
        stamp = f" written_unix_ns={time.time_ns()}" if args.stamp_lines else ""
        _emit(f"step={model.step} loss={loss!r}{stamp}")
        if args.checkpoint_every and model.step % args.checkpoint_every == 0:
            checkpoint()
            saved_at = model.step
        if args.step_sleep > 0 and model.step < args.steps:
            time.sleep(args.step_sleep)
    if args.checkpoint_every and saved_at != model.step:
        checkpoint()

    _emit(f"eval accuracy={model.accuracy(test_idx)!r}")
    _emit(f"done step={model.step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
