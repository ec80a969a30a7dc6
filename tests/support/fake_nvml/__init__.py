"""Run tasks.window.sampling.nvml.NvmlSampler against the stand-in libnvidia-ml.so.1 (fake_nvml.c).

pynvml dlopens "libnvidia-ml.so.1" once and keeps it for the process lifetime, so every
scenario runs the sampler in a fresh Python subprocess with LD_LIBRARY_PATH pointing at the
compiled stand-in and FAKE_NVML_SCENARIO at the scenario file. The subprocess prints the rows
as JSON; datetimes come back as aware datetimes.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "fake_nvml.c"
REPO = HERE.parents[2]

# What the subprocess runs: attributors from plain dicts, N reads, rows out as JSON.
_DRIVER = r"""
import json, sys, time
from tasks.window.sampling import Attribution, UNATTRIBUTED
from tasks.window.sampling.nvml import NvmlSampler, NvmlUnavailable

cfg = json.loads(sys.argv[1])
by_pid = {int(k): Attribution(**v) for k, v in cfg["pids"].items()}
by_minor = {int(k): Attribution(**v) for k, v in cfg["minors"].items()}
owner = (lambda uuid, minor: by_minor.get(minor, UNATTRIBUTED)) if by_minor else None
try:
    s = NvmlSampler("node-1", lambda pid: by_pid.get(pid, UNATTRIBUTED), gpu_owner=owner)
except NvmlUnavailable as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
    sys.exit(0)
reads = []
for i in range(cfg["reads"]):
    if i:
        time.sleep(cfg["sleep_s"])
    rows, gaps = s.read()
    reads.append({"rows": rows, "gaps": gaps})
s.close()
print(json.dumps({"reads": reads, "uuids": s.gpu_uuids}, default=lambda t: t.isoformat()))
"""

_TIME_COLUMNS = ("t_from", "t_to")


def compiled_library() -> Path:
    """Build the stand-in once per source version, in a cache dir keyed by the source hash."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    out_dir = Path(tempfile.gettempdir()) / "ckpt-poc-fake-nvml" / digest
    lib = out_dir / "libnvidia-ml.so.1"
    if lib.exists():
        return out_dir
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise RuntimeError("no C compiler (gcc/cc) to build the fake NVML library")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".lib.{os.getpid()}.so"
    subprocess.run(
        [gcc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(tmp), str(SOURCE)],
        check=True,
        capture_output=True,
        text=True,
    )
    tmp.replace(lib)  # atomic: concurrent test processes never load a half-written file
    return out_dir


def run_sampler(
    scenario: str,
    tmp_path: Path,
    *,
    reads: int = 3,
    sleep_s: float = 0.15,
    pids: dict[int, dict[str, Any]] | None = None,
    minors: dict[int, dict[str, Any]] | None = None,
    lib_dir: Path | None = None,
) -> dict[str, Any]:
    """Run `reads` reads of the sampler under `scenario`; return {"reads": [...], "uuids"}.

    pids / minors map a pid (for the attributor) / a minor number (for gpu_owner) to
    Attribution keyword arguments. `lib_dir` overrides the library directory (e.g. an empty
    one, to test a node without NVML).
    """
    path = tmp_path / "scenario.txt"
    path.write_text(scenario)
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = str(lib_dir if lib_dir is not None else compiled_library())
    env["FAKE_NVML_SCENARIO"] = str(path)
    cfg = {
        "reads": reads,
        "sleep_s": sleep_s,
        "pids": {str(k): v for k, v in (pids or {}).items()},
        "minors": {str(k): v for k, v in (minors or {}).items()},
    }
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER, json.dumps(cfg)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0:
        raise AssertionError(f"sampler subprocess failed ({proc.returncode}):\n{proc.stderr}")
    out = json.loads(proc.stdout)
    for read in out.get("reads", []):
        for row in (*read["rows"], *read["gaps"]):
            for col in _TIME_COLUMNS:
                row[col] = dt.datetime.fromisoformat(row[col])
    return out
