"""The GX worker process's side (tasks.data.gx_worker starts it): ``python -m`` this module."""

from __future__ import annotations

import sys
from typing import Any

from tasks.data import gates
from tasks.data.datasets import DATASETS
from tasks.data.gx_worker import receive, send


def main() -> None:
    """The worker's loop: build the context, say ready, answer samples until stdin ends."""
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # anything GX prints must not land in the replies
    gates._context()
    send(out, "ready")
    while True:
        try:
            gate, dataset, sample, total = receive(inp)
        except EOFError:
            return
        try:
            reply: Any = gates._gx_checks(gate, DATASETS[dataset], sample.to_pandas(), total)
        except Exception as exc:  # reported to the caller, which validates in process
            reply = f"{type(exc).__name__}: {exc}"
        send(out, reply)


if __name__ == "__main__":
    main()
