"""A small real inference server: the digits MLP behind stdlib ``http.server``.

    python -m examples.serve_digits --port 8000 --init-steps 300 --state-mb 64

It listens on 127.0.0.1 at once, then initialises for real (allocates the ballast, trains
the MLP of ``examples.train_digits`` for ``--init-steps`` steps, runs warm-up predictions
over the whole data set) while answering requests between those steps: ``/ready`` and
``/predict`` answer 503 until initialisation is over, then ``/ready`` answers 200. One
thread, one request at a time, HTTP/1.0 (each connection closes after its response, so a
CRIU dump between requests only has the listening socket to save).

Endpoints (JSON bodies):
    GET  /ready          200 {"ready": true, ...} once ready, 503 {"ready": false, ...} before
    GET  /healthz        200 always (liveness): {"alive": true, "ready": ..., "served": N}
    GET  /predict?i=K    prediction for digits sample K: {"i", "label", "pred", "probs"}
    POST /predict        body {"pixels": [64 values, 0..16 as in the data set]}

stdout, one flushed line per event:
    listening host=127.0.0.1 port=8000
    warmup accuracy=0.9583333333333334
    ready
    stopped                              (after SIGTERM / SIGINT)

Answers are deterministic for given --seed, --hidden and --init-steps.
"""

from __future__ import annotations

import argparse
import json
import math
import select
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import numpy as np

from examples import weights as weights_file
from examples.train_digits import (
    N_FEATURES,
    Ballast,
    Config,
    DigitsMLP,
    load_digits_arrays,
    read_weights,
    split_indices,
)

MAX_BODY = 64 * 1024


class DigitsServer(HTTPServer):
    def __init__(self, address: tuple[str, int], X: np.ndarray, y: np.ndarray):
        super().__init__(address, DigitsHandler)
        self.X, self.y = X, y
        self.model: DigitsMLP | None = None
        self.ballast: Ballast | None = None
        self.ready = False
        self.phase = "starting"
        self.init_step = 0
        self.served = 0

    def serve_pending(self) -> None:
        """Answer every request already waiting, without blocking (used during init)."""
        while select.select([self], [], [], 0)[0]:
            self.handle_request()

    def prediction(self, pixels: np.ndarray) -> tuple[int, list[float]]:
        assert self.model is not None
        probs = self.model.predict_proba(pixels)[0]
        return int(probs.argmax()), [float(p) for p in probs]


class DigitsHandler(BaseHTTPRequestHandler):
    server: DigitsServer
    server_version = "serve_digits/1"
    protocol_version = "HTTP/1.0"
    timeout = 10  # a stalled client cannot hold the single thread for long

    def log_message(self, format, *args):  # no per-request log lines
        pass

    def _send(self, code: int, obj: dict) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _not_ready(self) -> None:
        s = self.server
        self._send(503, {"ready": False, "phase": s.phase, "init_step": s.init_step})

    def _count(self) -> None:
        s = self.server
        s.served += 1
        if s.ballast is not None:
            s.ballast.touch(s.served)

    def do_GET(self) -> None:
        self._count()
        s = self.server
        url = urlsplit(self.path)
        if url.path == "/healthz":
            self._send(200, {"alive": True, "ready": s.ready, "served": s.served})
        elif url.path == "/ready":
            if s.ready:
                self._send(200, {"ready": True, "init_step": s.init_step, "served": s.served})
            else:
                self._not_ready()
        elif url.path == "/predict":
            if not s.ready:
                return self._not_ready()
            values = parse_qs(url.query).get("i", [])
            try:
                i = int(values[0])
                if not 0 <= i < len(s.y):
                    raise ValueError
            except (IndexError, ValueError):
                return self._send(400, {"error": f"need ?i=K with 0 <= K < {len(s.y)}"})
            pred, probs = s.prediction(s.X[i])
            self._send(200, {"i": i, "label": int(s.y[i]), "pred": pred, "probs": probs})
        else:
            self._send(404, {"error": "unknown path"})

    def do_POST(self) -> None:
        self._count()
        s = self.server
        if urlsplit(self.path).path != "/predict":
            return self._send(404, {"error": "unknown path"})
        if not s.ready:
            return self._not_ready()
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            return self._send(411, {"error": "Content-Length required"})
        if not 0 <= length <= MAX_BODY:
            return self._send(413, {"error": "body too large"})
        try:
            pixels = json.loads(self.rfile.read(length))["pixels"]
            if len(pixels) != N_FEATURES or not all(
                isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                for v in pixels
            ):
                raise ValueError
        except (ValueError, KeyError, TypeError):
            return self._send(400, {"error": f'need JSON {{"pixels": [{N_FEATURES} numbers]}}'})
        x = np.asarray(pixels, dtype=np.float64) / 16.0
        pred, probs = s.prediction(x)
        self._send(200, {"pred": pred, "probs": probs})


def _emit(line: str) -> None:
    print(line, flush=True)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m examples.serve_digits",
        description="Serve digits predictions over HTTP after a real initialisation.",
    )
    ap.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=8000, help="0 picks a free port (logged)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--init-steps", type=int, default=300, help="training steps before ready")
    ap.add_argument(
        "--weights",
        type=Path,
        metavar="FILE",
        help="load the model from FILE (python -m examples.weights --train-steps K) instead "
        "of training it: an engine's weights read from storage (--init-steps is then unused)",
    )
    ap.add_argument(
        "--init-step-sleep",
        type=float,
        default=0.0,
        metavar="S",
        help="seconds to sleep after each init step (stretches initialisation)",
    )
    ap.add_argument(
        "--warmup-rounds",
        type=int,
        default=3,
        help="passes of predictions over the whole data set before ready",
    )
    ap.add_argument(
        "--state-mb",
        type=int,
        default=0,
        metavar="M",
        help="keep M MiB of extra ballast memory resident (default 0)",
    )
    return ap


def load_model(
    path: Path, seed: int, hidden: int, X: np.ndarray, y: np.ndarray, train_idx: np.ndarray
) -> DigitsMLP:
    """The served model: its table and trained MLP weights read from ``path``."""
    tensors, _ = read_weights(path)
    if any(k not in tensors for k in weights_file.MLP_NAMES):
        print(f"cannot serve {path}: no trained weights (make it with --train-steps K)",
              file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    model = DigitsMLP(Config(seed=seed, hidden=hidden), X, y, train_idx, embed=tensors["embed"])
    model.params.update({k: tensors[k].astype(np.float64) for k in weights_file.MLP_NAMES})
    return model


def _stop(signum, frame):
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if min(args.init_steps, args.warmup_rounds, args.state_mb) < 0 or args.hidden < 1:
        ap.error("--init-steps, --warmup-rounds and --state-mb must be >= 0, --hidden >= 1")
    signal.signal(signal.SIGTERM, _stop)

    X, y = load_digits_arrays()
    server = DigitsServer((args.host, args.port), X, y)
    try:
        host, port = server.server_address[:2]
        _emit(f"listening host={host} port={port}")

        if args.state_mb > 0:
            server.phase = "ballast"
            server.ballast = Ballast.generate(args.state_mb, args.seed, server.serve_pending)

        train_idx, test_idx = split_indices(len(y))
        if args.weights is not None:
            server.phase = "loading"
            model = load_model(args.weights, args.seed, args.hidden, X, y, train_idx)
            server.serve_pending()
        else:
            server.phase = "training"
            model = DigitsMLP(Config(seed=args.seed, hidden=args.hidden), X, y, train_idx)
            for _ in range(args.init_steps):
                model.train_step()
                server.init_step = model.step
                server.serve_pending()
                if args.init_step_sleep > 0:
                    time.sleep(args.init_step_sleep)

        server.phase = "warmup"
        t0 = time.monotonic()
        if model.embed is not None:
            weights_file.checksum(model.embed)  # the table checked end to end
        for _ in range(args.warmup_rounds):
            # The whole data set as requests, one at a time, as clients will send them.
            for i in range(len(y)):
                model.predict_proba(X[i])
            server.serve_pending()
        _emit(f"warmup accuracy={model.accuracy(test_idx)!r} s={time.monotonic() - t0:.3f}")

        server.model = model
        server.phase = "ready"
        server.ready = True
        _emit("ready")
        server.serve_forever(poll_interval=0.5)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.server_close()
    _emit("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
