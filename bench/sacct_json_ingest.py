"""sacct --json against sacct -P: the same jobs through ``run_baseline``, side by side.

    uv run python bench/sacct_json_ingest.py --rows 200000      # develop
    uv run python bench/sacct_json_ingest.py --rows 1000000     # the target: JSON ≤ 2× -P

The -P dump is bench/synth_sacct.py's (cached under .run/bench/); the JSON document holds the
same jobs, each allocation row a job with its step rows as ``steps``, in data_parser v0.0.44's
shape (numbers as ``{set, infinite, number}``, states as flag lists, step ids "JOB.STEP",
energy as the -2 sentinel). Each contender runs in a fresh child; its wall time and peak RSS
(the larger of its own VmHWM and its process tree's RSS polled every 50 ms, which counts the
worker processes a big JSON document is converted by) are printed side by side with the
ratio. Fields the baseline does not read are
not in the document, so a real site's document (with statistics, comments, …) is larger.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import run_polled, self_peak_mib  # noqa: E402
from synth_sacct import cached_dump  # noqa: E402

CACHE = REPO / ".run" / "bench"
PLAN = REPO / "plans" / "demo.yaml"
BENCH_KEY = "bench-only-key-0123456789abcdef!"  # 32 characters, not a secret
TARGET_RATIO = 2.0
JSON_GENERATOR = 2  # bumped when write_json changes, so a cached document is not reused


def _epoch(text: str) -> int:
    if not text or text in ("Unknown", "None"):
        return 0
    return int(time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S")) - time.timezone)


def _no_val(n: int | None) -> dict[str, Any]:
    return {"set": n is not None, "infinite": False, "number": n or 0}


def _tres(text: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"type": "energy", "name": "", "id": 3, "count": -2}]
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        kind, _, sub = name.partition("/")
        if kind == "mem":  # JSON counts memory in MiB, -P prints it with a unit
            value = _mib(value)
        if value.isdigit():
            out.append({"type": kind, "name": sub, "id": 1, "count": int(value)})
    return out


_MEM_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def _mib(text: str) -> str:
    """A -P memory size ("32G", "500M") as JSON's count of MiB, as text ("" if not one)."""
    unit = _MEM_UNITS.get(text[-1:])
    if unit is None or not text[:-1].replace(".", "", 1).isdigit():
        return text
    return str(round(float(text[:-1]) * unit))


def _limit(text: str) -> dict[str, Any]:
    if text in ("UNLIMITED", "Partition_Limit", ""):
        return {"set": False, "infinite": text == "UNLIMITED", "number": 0}
    days, _, hms = text.rpartition("-")
    parts = [int(p) for p in hms.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return _no_val((int(days or 0) * 24 + parts[0]) * 60 + parts[1])


def _job(r: dict[str, str]) -> dict[str, Any]:
    shown = r["JobID"]
    array_job, task, het_job, offset = 0, None, 0, None
    if "_" in shown and "[" not in shown:
        a, t = shown.split("_", 1)
        array_job, task = int(a), int(t)
    elif "+" in shown:
        h, o = shown.split("+", 1)
        het_job, offset = int(h), int(o)
    return {
        "account": r["Account"],
        "allocation_nodes": int(r["NNodes"] or 0),
        "array": {"job_id": array_job, "task_id": _no_val(task)},
        "cluster": r["Cluster"],
        "exit_code": _exit(r["ExitCode"]),
        "het": {"job_id": het_job, "job_offset": _no_val(offset)},
        "job_id": int(r["JobIDRaw"]),
        "name": r["JobName"],
        "nodes": r["NodeList"],
        "partition": r["Partition"],
        "state": {"current": [r["State"].split(" ")[0]], "reason": "None"},
        "steps": [],
        "time": {
            "elapsed": int(r["ElapsedRaw"] or 0),
            "end": _epoch(r["End"]),
            "limit": _limit(r["Timelimit"]),
            "start": _epoch(r["Start"]),
            "submission": _epoch(r["Submit"]),
        },
        "tres": {"allocated": _tres(r["AllocTRES"])},
        "user": r["User"],
    }


def _exit(text: str) -> dict[str, Any]:
    rc, _, sig = text.partition(":")
    return {
        "status": ["SUCCESS"],
        "return_code": _no_val(int(rc) if rc.isdigit() else 0),
        "signal": {"id": _no_val(int(sig) if sig.isdigit() else None), "name": ""},
    }


def _step(r: dict[str, str]) -> dict[str, Any]:
    return {
        "time": {
            "elapsed": int(r["ElapsedRaw"] or 0),
            "start": _no_val(_epoch(r["Start"])),
            "end": _no_val(_epoch(r["End"])),
        },
        "exit_code": _exit(r["ExitCode"]),
        "nodes": {"count": int(r["NNodes"] or 0), "range": r["NodeList"]},
        "state": [r["State"].split(" ")[0]],
        "step": {"id": r["JobIDRaw"], "name": r["JobName"]},
        "tres": {"allocated": _tres(r["AllocTRES"])},
    }


def write_json(psv: Path, out: Path) -> tuple[int, int]:
    """The -P dump's jobs as one v0.0.44 document (steps under their job); (jobs, steps)."""
    jobs = steps = 0
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    with open(psv, newline="") as src, open(tmp, "w") as dst:
        reader = csv.DictReader(src, delimiter="|", quoting=csv.QUOTE_NONE)
        dst.write(
            '{"meta": {"plugin": {"data_parser": "data_parser/v0.0.44"}, "slurm": '
            '{"release": "25.11.0"}}, "errors": [], "warnings": [], "jobs": [\n'
        )
        current: dict[str, Any] | None = None
        for r in reader:
            if "." in r["JobIDRaw"] and current is not None:
                current["steps"].append(_step(r))
                steps += 1
                continue
            if current is not None:
                dst.write(("," if jobs > 1 else "") + json.dumps(current) + "\n")
            current, jobs = _job(r), jobs + 1
        if current is not None:
            dst.write(("," if jobs > 1 else "") + json.dumps(current) + "\n")
        dst.write("]}\n")
    os.replace(tmp, out)
    return jobs, steps


def child(path: str) -> None:
    """One baseline run in this process: prints its seconds, peak RSS and summary."""
    from tasks.baseline import run
    from tasks.baseline.run import run_baseline
    from tasks.data.plan import load_plan
    from tasks.data.runctx import make_run_context

    data = CACHE / f"data-{os.getpid()}"
    plan = load_plan(PLAN).model_copy(update={"data_dir": str(data)})
    opening = run.open_accounting
    read_s = 0.0

    def timed_open(*args: Any, **kwargs: Any) -> Any:  # a JSON document is converted here
        nonlocal read_s
        t = time.perf_counter()
        try:
            return opening(*args, **kwargs)
        finally:
            read_s = time.perf_counter() - t

    run.open_accounting = timed_open
    t = time.perf_counter()
    result = run_baseline(plan, make_run_context(plan, PLAN), sacct_file=path, use_dask=False)
    secs = time.perf_counter() - t
    peak = self_peak_mib()
    s = result.summary
    print(
        json.dumps(
            {
                "seconds": secs,
                "read_s": read_s,
                "peak_mib": peak,
                "rows_read": s["rows_read"],
                "quarantined": s["rows_quarantined"],
                "allocations": sum(s["allocations_by_state"].values()),
                "allocations_by_state": s["allocations_by_state"],
                "gpu_hours_by_state": s["gpu_hours_by_state"],
                "node_hours_by_state": s["node_hours_by_state"],
                "exposed_gpu_hours": s["exposed_gpu_hours"],
                "chains": len(s["chains"]),
            }
        )
    )


def run_child(path: Path) -> dict[str, Any]:
    """One contender in a fresh child. Its own peak (VmHWM) misses the worker processes a big
    JSON document is converted by (tasks/baseline/sacct_json_parallel.py), so the child's
    whole process tree is polled too; ``peak_mib`` is the larger of the two."""
    env = {**os.environ, "CKPT_POC_PSEUDONYM_KEY": BENCH_KEY}
    log = CACHE / f"child-{path.name}.log"
    code, _, tree = run_polled([sys.executable, __file__, "--child", str(path)], log, env)
    if code != 0:
        raise SystemExit(f"{path.name}: the child failed ({code}); see {log}")
    r = json.loads(log.read_text().strip().splitlines()[-1])
    r["self_peak_mib"], r["tree_peak_mib"] = r["peak_mib"], tree / 2**20
    r["peak_mib"] = max(r["self_peak_mib"], r["tree_peak_mib"])
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000, help="rows of the -P dump")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3, help="runs of each (default 3)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child)
        return 0
    psv, _ = cached_dump(CACHE, args.rows, args.seed)
    doc = psv.with_suffix(f".v0.0.44.g{JSON_GENERATOR}.json")
    if not doc.exists():
        t = time.perf_counter()
        jobs, steps = write_json(psv, doc)
        print(f"wrote {jobs:,} jobs ({steps:,} steps) as JSON in {time.perf_counter() - t:.1f}s")
    print(f"-P   {psv.stat().st_size / 2**20:8.0f} MiB  {psv.name}")
    print(f"JSON {doc.stat().st_size / 2**20:8.0f} MiB  {doc.name}")
    # Rounds in alternating order (-P first, then JSON first, ...): a machine that slows
    # down half-way weighs on both. Every run is printed; the ratio is of the medians.
    runs: dict[str, list[dict[str, Any]]] = {"-P": [], "JSON": []}
    for i in range(args.rounds):
        order = (("-P", psv), ("JSON", doc)) if i % 2 == 0 else (("JSON", doc), ("-P", psv))
        for name, path in order:
            runs[name].append(run_child(path))
    for name, rs in runs.items():
        for i, r in enumerate(rs, start=1):
            print(
                f"{name:5} run {i}: {r['seconds']:6.1f} s (opening the input "
                f"{r['read_s']:5.1f} s)  peak {r['peak_mib']:5.0f} MiB (own "
                f"{r['self_peak_mib']:.0f}, tree polled {r['tree_peak_mib']:.0f})"
            )
    psv_r, json_r = (_median(runs[name]) for name in ("-P", "JSON"))
    for name, r in (("-P", psv_r), ("JSON", json_r)):
        print(
            f"{name:5} median {r['seconds']:6.1f} s (opening {r['read_s']:4.1f} s)  peak "
            f"{r['peak_mib']:7.0f} MiB  rows {r['rows_read']:,}  quarantined "
            f"{r['quarantined']:,}  allocations {r['allocations']:,}"
        )
    pairs = zip(runs["-P"], runs["JSON"], strict=True)
    problems = [problem for a, b in pairs for problem in disagreements(a, b)]
    for problem in problems:
        print(f"DISAGREE: {problem}")
    ratio = json_r["seconds"] / psv_r["seconds"]
    print(
        f"ratio JSON/-P {ratio:.2f} (target ≤ {TARGET_RATIO}): "
        f"{'met' if ratio <= TARGET_RATIO else 'NOT met'}"
    )
    if not problems:
        print("agreement: -P and JSON give the same states, node/GPU-hours, exposure and chains")
    return 1 if problems else 0


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median seconds (of an even number, the slower middle one)."""
    return sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]


def disagreements(psv: dict[str, Any], doc: dict[str, Any]) -> list[str]:
    """What the two readings of the same jobs count differently (hours to 1e-9 relative)."""
    problems = [
        f"{key}: -P {psv[key]!r}, JSON {doc[key]!r}"
        for key in ("rows_read", "quarantined", "allocations_by_state", "chains")
        if psv[key] != doc[key]
    ]
    for key in ("gpu_hours_by_state", "node_hours_by_state"):
        for state in sorted(set(psv[key]) | set(doc[key])):
            a, b = psv[key].get(state), doc[key].get(state)
            if a is None or b is None or abs(a - b) > 1e-9 * max(abs(a), abs(b), 1.0):
                problems.append(f"{key}[{state}]: -P {a!r}, JSON {b!r}")
    a, b = psv["exposed_gpu_hours"], doc["exposed_gpu_hours"]
    if abs(a - b) > 1e-9 * max(abs(a), abs(b), 1.0):
        problems.append(f"exposed_gpu_hours: -P {a!r}, JSON {b!r}")
    return problems


if __name__ == "__main__":
    raise SystemExit(main())
