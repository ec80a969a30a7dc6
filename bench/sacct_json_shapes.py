"""Converting ``sacct --json`` as a site's sacct writes it: ours against the readings before it.

    uv run python bench/sacct_json_shapes.py               # 50 k jobs (720 MiB)
    uv run python bench/sacct_json_shapes.py --jobs 20000  # develop

bench/sacct_json_ingest.py's document holds only the fields the baseline reads, and no steps.
A real v0.0.44 document (Slurm 25.11) holds much more a job: association, comment, flags, QOS,
submit line, working directory, … and steps (batch, extern, srun) with their statistics and
TRES requested/consumed (min, max, average, total). This bench writes such a document, the
12 jobs of tests/support/fixtures/sacct_json/v0.0.44.json repeated with fresh ids plus those unread
fields in the structure of Slurm's v0.0.44 OpenAPI specification, and converts it three ways,
each in a fresh child process, one process each (CKPT_POC_JSON_WORKERS=1):

* ours: sacct_json.convert_sacct_json as it is (msgspec's typed reading of a chunk first);
* orjson: the same with the typed reading refused, so every chunk is decoded by orjson into
  dicts and read by fast_job_rows (this project's reading before the typed one);
* stdlib: the standard library's decoder job by job and job_rows (the reading with no
  shortcut, which every other must agree with).

The three PSVs must be byte-identical, or it exits 1. Printed: seconds, µs a job, peak RSS
(the child's VmHWM), and the ratios.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import self_peak_mib  # noqa: E402

CACHE = REPO / ".run" / "bench"
FIXTURE = REPO / "tests" / "fixtures" / "sacct_json" / "v0.0.44.json"
GENERATOR = 1  # bumped when the document changes, so a cached one is not reused
WAYS = ("ours", "orjson", "stdlib")


def _no_val(n: int) -> dict[str, Any]:
    return {"set": True, "infinite": False, "number": n}


def _tres_list(n: int) -> list[dict[str, Any]]:
    return [
        {"type": kind, "name": name, "id": i + 1, "count": n * (i + 1)}
        for i, (kind, name) in enumerate(
            (("cpu", ""), ("mem", ""), ("energy", ""), ("node", ""), ("fs", "disk"))
        )
    ]


def _statistics(n: int) -> dict[str, Any]:
    """A step's statistics and TRES usage as v0.0.44 writes them (not read by the baseline)."""
    usage = {
        "max": _tres_list(n),
        "min": _tres_list(n // 2 + 1),
        "average": _tres_list(n // 3 + 1),
        "total": _tres_list(n * 4),
    }
    return {
        "statistics": {
            "CPU": {"actual_frequency": 2400000},
            "energy": {"consumed": _no_val(0)},
        },
        "CPU": {
            "requested_frequency": {"min": _no_val(0), "max": _no_val(0)},
            "governor": "",
        },
        "task": {"distribution": "block"},
        "tasks": {"count": 4},
        "pid": "",
        "kill_request_user": "",
        "time_extra": {
            "system": {"seconds": n, "microseconds": 1200},
            "user": {"seconds": n * 9, "microseconds": 5400},
            "total": {"seconds": n * 10, "microseconds": 6600},
            "suspended": 0,
        },
        "tres_usage": {"requested": usage, "consumed": copy.deepcopy(usage)},
    }


def _unread_job_fields(n: int) -> dict[str, Any]:
    return {
        "association": {"account": "acct", "cluster": "c1", "partition": "", "user": "u", "id": n},
        "block": "",
        "comment": {"administrator": "", "job": "", "system": ""},
        "constraints": "",
        "container": "",
        "derived_exit_code": {
            "status": ["SUCCESS"],
            "return_code": _no_val(0),
            "signal": {"id": _no_val(0), "name": ""},
        },
        "extra": "",
        "failed_node": "",
        "flags": ["STARTED_ON_SUBMIT", "CRON_JOB_NOT", "SCHEDULING_BACKFILL"],
        "group": "users",
        "hold": False,
        "kill_request_user": "",
        "licenses": "",
        "mcs": {"label": ""},
        "priority": _no_val(4294901 - n % 1000),
        "qos": "normal",
        "qosreq": "",
        "required": {"CPUs": 4, "memory_per_cpu": _no_val(0), "memory_per_node": _no_val(8192)},
        "kill_request": "",
        "reservation": {"id": 0, "name": "", "requested": ""},
        "restart_cnt": 0,
        "script": "",
        "stdin_expanded": "/dev/null",
        "stdout_expanded": f"/home/u/slurm-{n}.out",
        "stderr_expanded": f"/home/u/slurm-{n}.out",
        "submit_line": f"sbatch --gres=gpu:1 --time=01:00:00 run-{n % 97}.sh",
        "wckey": {"wckey": "", "flags": []},
        "working_directory": "/home/u/project",
    }


def write_document(jobs: int, out: Path) -> None:
    """``jobs`` jobs: the fixture's, repeated with fresh ids, plus the fields not read."""
    fixture = json.loads(FIXTURE.read_text())
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as dst:
        dst.write('{"meta": ' + json.dumps(fixture["meta"]) + ', "errors": [], "jobs": [\n')
        for n in range(jobs):
            job = copy.deepcopy(fixture["jobs"][n % len(fixture["jobs"])])
            old_id, new_id = job["job_id"], 1_000_000 + n
            job["job_id"] = new_id
            job.update(_unread_job_fields(n))
            for step in job.get("steps") or []:
                ident = step["step"]["id"]
                if isinstance(ident, str) and ident.startswith(f"{old_id}."):
                    step["step"]["id"] = f"{new_id}.{ident.split('.', 1)[1]}"
                step.update(_statistics(n % 5000 + 1))
            dst.write(("," if n else "") + json.dumps(job, indent=2) + "\n")
        dst.write("]}\n")
    os.replace(tmp, out)


def child(way: str, path: str, out: str) -> None:
    """One conversion in this process; prints its seconds and peak, writes the PSV to out."""
    os.environ["CKPT_POC_JSON_WORKERS"] = "1"
    from tasks.baseline import sacct_json, sacct_json_fast

    if way == "orjson":
        sacct_json_fast.chunk_rows = lambda chunk: None  # type: ignore[assignment]
    elif way == "stdlib":
        sacct_json.fast_jobs = _unchunked  # type: ignore[assignment]
        sacct_json.fast_job_rows = _not_common  # type: ignore[assignment]
    data = Path(path).read_bytes()
    t = time.perf_counter()
    conversion = sacct_json.convert_sacct_json(data, "bench")
    seconds = time.perf_counter() - t
    Path(out).write_bytes(conversion.psv)
    print(json.dumps({"seconds": seconds, "peak_mib": self_peak_mib(), "jobs": conversion.jobs}))


def _unchunked(*_: Any) -> Any:
    from tasks.baseline.sacct_json import Unchunked

    raise Unchunked


def _not_common(_: Any) -> Any:
    from tasks.baseline.sacct_json import NotCommon

    raise NotCommon


def run_way(way: str, doc: Path) -> tuple[dict[str, Any], bytes]:
    out = CACHE / f"shapes-{way}.psv"
    cmd = [sys.executable, __file__, "--child", way, "--doc", str(doc), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{way}: the child failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    psv = out.read_bytes()
    out.unlink()
    return result, psv


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=50_000)
    ap.add_argument("--child", choices=WAYS, help=argparse.SUPPRESS)
    ap.add_argument("--doc", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.doc, args.out)
        return 0
    CACHE.mkdir(parents=True, exist_ok=True)
    doc = CACHE / f"sacct-site-shaped-j{args.jobs}-g{GENERATOR}.v0.0.44.json"
    if not doc.exists():
        t = time.perf_counter()
        write_document(args.jobs, doc)
        print(f"wrote {args.jobs:,} jobs in {time.perf_counter() - t:.1f} s")
    size = doc.stat().st_size
    print(f"document: {doc.name}, {size / 2**20:,.0f} MiB, {size / args.jobs:,.0f} B a job")
    results, psvs = {}, {}
    for way in WAYS:
        results[way], psvs[way] = run_way(way, doc)
    ours = results["ours"]["seconds"]
    print(f"{'reading':8} {'seconds':>8} {'µs/job':>8} {'peak MiB':>9} {'vs ours':>8}")
    for way in WAYS:
        r = results[way]
        print(
            f"{way:8} {r['seconds']:8.2f} {r['seconds'] / args.jobs * 1e6:8.1f} "
            f"{r['peak_mib']:9,.0f} {r['seconds'] / ours:7.2f}x"
        )
    differ = [way for way in WAYS[1:] if psvs[way] != psvs["ours"]]
    if differ:
        print(f"FAIL: the PSV of {', '.join(differ)} differs from ours")
        return 1
    print("agreement: the three readings give byte-identical PSVs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
