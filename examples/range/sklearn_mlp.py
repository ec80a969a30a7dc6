"""A training job on a real ML framework: scikit-learn's MLPClassifier, one minibatch a step.

    python -m examples.range.sklearn_mlp --steps 2000 --checkpoint-every 500 \
        --checkpoint-dir DIR [--resume]

The ``examples`` package sets one BLAS thread unless the caller set a count: plans/range.yaml
sets OPENBLAS_NUM_THREADS/OMP_NUM_THREADS to 4, so this is a multi-threaded process, as a
framework's job is. Everything here is scikit-learn's API (``load_digits``,
``MLPClassifier.partial_fit``, ``score``); the loop only feeds it minibatches in an order
drawn from a seeded generator, so two runs with the same flags print the same numbers.

stdout, one flushed line per event:

    start steps=2000 hidden=128 seed=0
    resumed step=500                       (only with --resume and a checkpoint present)
    step=501 loss=0.123...                 (one per step; loss is repr(float))
    checkpoint step=1000                   (after DIR/mlp.ckpt is in place)
    final step=2000 accuracy=0.97... coefs_sha256=...   (also written to DIR/final.txt)

The application checkpoint (DIR/mlp.ckpt) is scikit-learn's documented persistence (pickle)
of the estimator, with the generator's state and the position in the epoch: written to a
temporary file, fsynced, renamed. It is only ever read back by this script, from the folder
this run was given.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pickle
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPClassifier

CKPT_NAME = "mlp.ckpt"
FINAL_NAME = "final.txt"


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--checkpoint-dir", type=Path)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--step-sleep", type=float, default=0.0)
    args = p.parse_args(argv)
    if (args.checkpoint_every or args.resume) and args.checkpoint_dir is None:
        p.error("--checkpoint-every and --resume need --checkpoint-dir")
    return args


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _config(args: argparse.Namespace) -> dict[str, int]:
    return {"seed": args.seed, "hidden": args.hidden, "batch_size": args.batch_size}


def main(argv: list[str] | None = None) -> int:
    args = _args(sys.argv[1:] if argv is None else argv)
    digits = load_digits()
    X, y = digits.data / 16.0, digits.target
    held_out = np.arange(len(y)) % 5 == 0  # every fifth sample: fixed, no randomness
    X_train, y_train, X_test, y_test = X[~held_out], y[~held_out], X[held_out], y[held_out]
    classes = np.unique(y)
    model = MLPClassifier(
        hidden_layer_sizes=(args.hidden,),
        solver="sgd",
        learning_rate_init=0.05,
        momentum=0.9,
        batch_size=args.batch_size,
        random_state=args.seed,
    )
    rng = np.random.default_rng(args.seed)
    perm, pos, step = rng.permutation(len(y_train)), 0, 0
    print(f"start steps={args.steps} hidden={args.hidden} seed={args.seed}", flush=True)
    ckpt = args.checkpoint_dir / CKPT_NAME if args.checkpoint_dir else None
    if args.resume and ckpt is not None and ckpt.exists():
        state = pickle.loads(ckpt.read_bytes())  # this script's own file (see the docstring)
        if state["config"] != _config(args):
            print(f"checkpoint {ckpt} was written with {state['config']}", file=sys.stderr)
            return 2
        model, perm, pos, step = state["model"], state["perm"], state["pos"], state["step"]
        rng.bit_generator.state = state["rng"]
        print(f"resumed step={step}", flush=True)
    # One minibatch per partial_fit is one SGD step; sklearn warns it did not converge.
    warnings.filterwarnings("ignore", category=ConvergenceWarning)
    while step < args.steps:
        if pos + args.batch_size > len(perm):
            perm, pos = rng.permutation(len(y_train)), 0
        batch = perm[pos : pos + args.batch_size]
        pos += args.batch_size
        model.partial_fit(X_train[batch], y_train[batch], classes=classes)
        step += 1
        print(
            f"step={step} loss={float(model.loss_)!r}", flush=True
        )  # NumPy 2's repr is np.float64(...)
        if ckpt is not None and args.checkpoint_every and step % args.checkpoint_every == 0:
            state = {"model": model, "rng": rng.bit_generator.state, "perm": perm}
            state |= {"pos": pos, "step": step, "config": _config(args)}
            _write_atomic(ckpt, pickle.dumps(state))
            print(f"checkpoint step={step}", flush=True)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    digest = hashlib.sha256(b"".join(c.tobytes() for c in model.coefs_)).hexdigest()
    final = f"final step={step} accuracy={model.score(X_test, y_test)!r} coefs_sha256={digest}"
    if args.checkpoint_dir is not None:
        _write_atomic(args.checkpoint_dir / FINAL_NAME, (final + "\n").encode())
    print(final, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
