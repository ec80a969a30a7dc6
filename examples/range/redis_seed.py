"""Give the Redis workload its data: DIR/dump.rdb with N keys, written by Redis itself.

    python examples/range/redis_seed.py DIR [--keys 20000]

Starts a throwaway ``redis-server`` (Debian's) on a Unix socket in a short temporary
folder (a socket path holds at most 107 bytes; DIR may be longer), sends it N ``SET``
commands through ``redis-cli --pipe`` (Redis's own mass-insertion protocol), has it ``SAVE``
and shuts it down. The workload's ``redis-server --dir DIR`` then loads the keys at start;
it runs with ``--save ""`` so nothing rewrites the file while CRIU holds it. Key ``k:I``
holds the first 32 hex digits of sha256("I"): the same data on every run.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RDB_NAME = "dump.rdb"
SEED_SOCKET = "seed.sock"


def _resp(*args: str) -> bytes:
    """One command in Redis's wire protocol (RESP)."""
    out = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def seed_commands(keys: int) -> bytes:
    return b"".join(
        _resp("SET", f"k:{i}", hashlib.sha256(str(i).encode()).hexdigest()[:32])
        for i in range(keys)
    )


def _wait_for(
    path: Path, server: subprocess.Popen[bytes], log: Path, timeout_s: float = 10
) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if server.poll() is not None:
            said = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
            raise SystemExit(
                f"redis-server exited {server.returncode} before {path} appeared: "
                f"{said[0] if said else '(nothing in ' + str(log) + ')'}"
            )
        if time.monotonic() > deadline:
            raise SystemExit(f"redis-server did not open {path} within {timeout_s:.0f} s")
        time.sleep(0.02)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--keys", type=int, default=20000)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    for program in ("redis-server", "redis-cli"):
        if shutil.which(program) is None:
            print(f"{program} not found: install Debian's redis-server", file=sys.stderr)
            return 1
    folder: Path = args.dir.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RDB_NAME).unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="redis-seed-") as short:
        return _seed(folder, Path(short) / SEED_SOCKET, args.keys)


def _seed(folder: Path, sock: Path, keys: int) -> int:
    log = folder / "seed.log"
    argv = ["redis-server", "--port", "0", "--unixsocket", str(sock), "--dir", str(folder)]
    argv += ["--dbfilename", RDB_NAME, "--save", "", "--appendonly", "no"]
    argv += ["--logfile", str(log)]
    server = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    try:
        _wait_for(sock, server, log)
        cli = ["redis-cli", "-s", str(sock)]
        subprocess.run([*cli, "--pipe"], input=seed_commands(keys), check=True)
        subprocess.run([*cli, "SAVE"], check=True, stdout=subprocess.DEVNULL)
        subprocess.run([*cli, "SHUTDOWN", "NOSAVE"], check=False, stdout=subprocess.DEVNULL)
        server.wait(timeout=10)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    if not (folder / RDB_NAME).is_file():
        print(f"redis-server wrote no {folder / RDB_NAME}", file=sys.stderr)
        return 1
    print(f"seeded keys={keys} rdb={folder / RDB_NAME}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
