"""A serving engine for the ``gpt2-decoder`` weights that ``examples.gpu.weights_lm`` writes:
it reads them from local safetensors files onto the GPU (the CPU where there is none), warms
up, then answers over HTTP.

    python -m examples.gpu.serve_lm --weights DIR --port 8000 [--device auto|cpu|cuda]

It listens on 127.0.0.1 at once and answers 503 until it is ready: the weights read and
moved to the device, every tensor checked finite, ``--warmup`` generations run. One thread,
HTTP/1.0 (a CRIU dump between requests has only the listening socket to save).

    GET /ready                     200 {"ready": true, ...} once ready, else 503
    GET /healthz                   200 always
    GET /generate?prompt=1,2,3&tokens=8   {"tokens": [...]}: greedy, deterministic

stdout, one flushed line per event: ``listening port=P``, ``loaded bytes=B seconds=S
device=D``, ``ready``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import select
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from examples.gpu.model import Decoder, LmConfig, pick_device
from examples.gpu.weights_lm import INDEX

MAX_TOKENS = 256


def load_decoder(folder: Path, device: torch.device) -> tuple[Decoder, int]:
    """The decoder of ``folder``'s weights on ``device`` (float16 on a GPU, float32 on the
    CPU), built without a random initialisation first; and the bytes read."""
    index = json.loads((folder / INDEX).read_text())
    cfg = LmConfig.from_metadata(index["metadata"])
    with torch.device("meta"):
        model = Decoder(cfg)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(folder / shard, framework="pt") as fh:
            if fh.metadata() != index["metadata"]:
                raise ValueError(f"{folder / shard}: its metadata is not the index's")
        loaded = load_file(folder / shard, device=str(device))
        state.update({k: v.to(dtype) for k, v in loaded.items()})
    model.load_state_dict(state, strict=True, assign=True)
    causal = torch.triu(torch.ones(cfg.context, cfg.context, dtype=torch.bool), diagonal=1)
    model.mask = causal.to(device)
    bad = [k for k, v in state.items() if not torch.isfinite(v).all()]
    if bad:
        raise ValueError(f"{folder}: tensors with non-finite values: {bad[:5]}")
    return model.eval(), int(index["total_size"])


class LmServer(HTTPServer):
    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(address, LmHandler)
        self.model: Decoder | None = None
        self.ready = False
        self.served = 0

    def serve_pending(self) -> None:
        while select.select([self], [], [], 0)[0]:
            self.handle_request()


class LmHandler(BaseHTTPRequestHandler):
    server: LmServer
    protocol_version = "HTTP/1.0"
    timeout = 10

    def log_message(self, format, *args):  # no per-request log lines
        pass

    def _send(self, code: int, obj: dict) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        s = self.server
        s.served += 1
        url = urlsplit(self.path)
        if url.path == "/healthz":
            return self._send(200, {"alive": True, "ready": s.ready, "served": s.served})
        if url.path == "/ready":
            return self._send(200 if s.ready else 503, {"ready": s.ready})
        if url.path != "/generate":
            return self._send(404, {"error": "unknown path"})
        if not s.ready or s.model is None:
            return self._send(503, {"ready": False})
        query = parse_qs(url.query)
        try:
            prompt = [int(t) for t in query.get("prompt", ["0"])[0].split(",")]
            tokens = int(query.get("tokens", ["8"])[0])
            vocab = s.model.cfg.vocab
            if (
                not prompt
                or not 1 <= tokens <= MAX_TOKENS
                or not all(0 <= t < vocab for t in prompt)
            ):
                raise ValueError
        except ValueError:
            return self._send(
                400, {"error": f"need ?prompt=T,T,… (0 <= T < vocab)&tokens=1..{MAX_TOKENS}"}
            )
        self._send(200, {"tokens": s.model.generate(prompt, tokens)})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", type=Path, required=True, metavar="DIR")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--warmup", type=int, default=3, help="generations before ready")
    args = ap.parse_args(argv)
    server = LmServer(("127.0.0.1", args.port))
    print(f"listening port={server.server_address[1]}", flush=True)
    device = pick_device(args.device)
    t0 = time.perf_counter()
    model, nbytes = load_decoder(args.weights, device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    print(f"loaded bytes={nbytes} seconds={seconds:.3f} device={device}", flush=True)
    server.serve_pending()
    for i in range(args.warmup):
        model.generate([i + 1, i + 2, i + 3], 8)
        server.serve_pending()
    server.model, server.ready = model, True
    print("ready", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever(poll_interval=0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
