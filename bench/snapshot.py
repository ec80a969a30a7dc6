"""What one node snapshot costs: time and peak memory of `tasks.exit.snapshots.collect` on this
machine with the default watch (every kind, the default watched paths), beside the obvious
alternative in the same run: Debian's `debsums` plus `find <paths> -xdev -type f -exec
sha256sum {} +` over the same paths.

Like with like: in the busy folders ours records names only (/tmp, /var/tmp, /run, /dev/shm,
/var/log, two levels deep), so the alternative lists them with `find -maxdepth 2` and hashes
only the other watched paths. What each covers is printed beside its figures:

- ours: every kind (packages with changed conffiles, units, files with sha256, mode, owner
  and capabilities, modules, sysctls, sockets, processes, mounts, users, cron, ldconfig);
- `debsums -a`: the md5 of every file of every installed package (conffiles included),
  which reads all of /usr: far more bytes than ours, which checks only the conffiles;
- `debsums -e`: conffiles only, what ours' packages kind checks (the closer match);
- find: regular files' sha256 under the hashed paths (no mode, owner, links or
  capabilities), and the busy folders' names.

`debsums` is installed here with apt-get if it is missing (and the output says so): it is
not part of the project's setup, as it ships its own cron jobs, and collecting must not
change the node it observes. Each contender runs in its own subprocess, in alternating
order after one untimed warm-up round (so every contender reads from a warm page cache);
the median of the timed rounds is printed, with each process's peak RSS.

    uv run python bench/snapshot.py [--rounds 2] [--no-warmup]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import benchlib

REPO = benchlib.REPO
sys.path.insert(0, str(REPO))

from tasks.data.plan import Watch  # noqa: E402  (after the path is set)
from tasks.exit.collectors.files import NAMES_ONLY_DEPTH  # noqa: E402

TARGET_S = 30.0

# Ours, in a fresh interpreter: imports are outside the timed part, as the alternative's
# interpreter start is outside its own.
OURS = r"""
import json, resource, sys, time
from collections import Counter
from tasks.data.plan import Watch
from tasks.exit.snapshots import collect
watch = Watch.model_validate_json(sys.argv[1])
t0 = time.perf_counter()
rows = collect("bench", watch)
seconds = time.perf_counter() - t0
print(json.dumps({
    "seconds": seconds,
    "kinds": dict(Counter(r["kind"] for r in rows)),
    "errors": [f"{r['key']}: {r['value']}" for r in rows if r["kind"] == "error"][:5],
    "self_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
}))
"""

# The alternative's commands, run in turn by a small driver that times them and reads their
# peak RSS (RUSAGE_CHILDREN: the largest child; the driver itself is ~10 MiB).
DRIVER = r"""
import json, resource, subprocess, sys, time
cmds = json.loads(sys.argv[1])
out = sys.argv[2]
t0 = time.perf_counter()
codes, lines = [], 0
with open(out, "wb") as fh:
    for argv in cmds:
        done = subprocess.run(argv, stdout=fh, stderr=subprocess.DEVNULL, check=False)
        codes.append(done.returncode)
seconds = time.perf_counter() - t0
with open(out, "rb") as fh:
    lines = sum(1 for _ in fh)
print(json.dumps({
    "seconds": seconds,
    "codes": codes,
    "lines": lines,
    "children_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
    "self_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
}))
"""


def ensure_debsums() -> str:
    """debsums on PATH; installed with apt-get when missing (for this bench only)."""
    found = shutil.which("debsums")
    if found:
        print(f"debsums: {found} (already installed)")
        return found
    print("debsums is not installed: installing it for this bench (apt-get install -y debsums)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "debsums"]
    done = subprocess.run(install, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:  # stale package lists: refresh them once and try again
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env, check=False)
        done = subprocess.run(install, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        sys.exit(f"apt-get install -y debsums failed: {done.stderr[-1000:]}")
    found = shutil.which("debsums")
    if not found:
        sys.exit("debsums was installed but is not on PATH")
    return found


def alternative_cmds(watch: Watch, debsums: str, mode: str) -> list[list[str]]:
    """debsums (``mode``: -a every package file, -e conffiles only), then find over the
    same paths as ours: hashed where ours hashes, names only where ours keeps names."""
    names_only = [p for p in watch.names_only if os.path.exists(p)]
    hashed = [p for p in watch.paths if os.path.exists(p) and not any(p == n for n in names_only)]
    return [
        [debsums, mode],
        ["find", *hashed, "-xdev", "-type", "f", "-exec", "sha256sum", "{}", "+"],
        # Names only, as deep as ours goes (the folder itself, then NAMES_ONLY_DEPTH levels).
        ["find", *names_only, "-xdev", "-maxdepth", str(NAMES_ONLY_DEPTH), "-printf", "%y %p\n"],
    ]


def run_child(argv: list[str], log: Path) -> dict:
    code, wall, polled = benchlib.run_polled(argv, log)
    text = log.read_text(errors="replace").strip().splitlines()
    if code != 0 or not text:
        sys.exit(f"{argv[:3]} exited {code}: {' '.join(text[-5:])}")
    result = json.loads(text[-1])
    result["process_s"] = wall
    result["polled_mib"] = polled / 2**20
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds (default 2)")
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed round")
    args = parser.parse_args()
    watch = Watch()
    debsums = ensure_debsums()
    work = Path(tempfile.mkdtemp(prefix="bench-snapshot-"))
    try:
        contenders = {
            "ours (every kind)": [sys.executable, "-c", OURS, watch.model_dump_json()],
            "ours (files kind only)": [
                sys.executable,
                "-c",
                OURS,
                Watch(kinds=["files"]).model_dump_json(),
            ],
        }
        for mode in ("-a", "-e"):
            cmds = alternative_cmds(watch, debsums, mode)
            out = str(work / f"alt{mode}.out")
            contenders[f"debsums {mode} + find"] = [
                sys.executable,
                "-c",
                DRIVER,
                json.dumps(cmds),
                out,
            ]
        code = benchlib.code_version(
            "tasks/exit/snapshots.py", "tasks/exit/collectors", "bench/snapshot.py"
        )
        print(
            f"code {code}; "
            f"watched paths {' '.join(watch.paths)}; names only: {' '.join(watch.names_only)}"
        )
        print("alternative, as run:")
        for cmd in alternative_cmds(watch, debsums, "-a|-e"):
            print("  " + " ".join(cmd))
        results: dict[str, list[dict]] = {name: [] for name in contenders}
        rounds = ([False] if not args.no_warmup else []) + [True] * args.rounds
        for i, timed in enumerate(rounds):
            order = list(contenders) if i % 2 == 0 else list(reversed(contenders))
            for name in order:
                result = run_child(contenders[name], work / "child.log")
                if timed:
                    results[name].append(result)
            print(f"round {i + 1}/{len(rounds)} done{'' if timed else ' (warm-up, untimed)'}")
        report(results)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(results: dict[str, list[dict]]) -> None:
    med = {name: statistics.median(r["seconds"] for r in rs) for name, rs in results.items()}
    peak = {
        name: max(max(r["self_kib"], r.get("children_kib", 0)) / 1024 for r in rs)
        for name, rs in results.items()
    }
    polled = {name: max(r["polled_mib"] for r in rs) for name, rs in results.items()}
    print(f"{'contender':<26} {'seconds':>8} {'runs':>20} {'peak RSS MiB':>13} {'polled':>7}")
    for name, rs in results.items():
        runs = ", ".join(f"{r['seconds']:.2f}" for r in rs)
        print(f"{name:<26} {med[name]:>8.2f} {runs:>20} {peak[name]:>13.0f} {polled[name]:>7.0f}")
    ours = results["ours (every kind)"][-1]
    print(
        "ours: "
        + ", ".join(f"{k} {v:,}" for k, v in sorted(ours["kinds"].items()))
        + (f"; errors: {ours['errors']}" if ours["errors"] else "")
    )
    for name, rs in results.items():
        if "codes" in rs[-1]:
            print(
                f"{name}: {rs[-1]['lines']:,} output lines; exit codes "
                f"(debsums, find hashed, find names) {rs[-1]['codes']}"
            )
    full = med["ours (every kind)"]
    for alt in ("debsums -a + find", "debsums -e + find"):
        ratio = full / med[alt]
        print(
            f"ours / ({alt}): {ratio:.2f}x -> target <= 1.0x (no slower): "
            f"{benchlib.verdict(ratio <= 1.0)}"
        )
    files = med["ours (files kind only)"] / med["debsums -e + find"]
    print(f"ours files kind / (debsums -e + find): {files:.2f}x (same paths, files only)")
    print(
        f"ours, one snapshot: {full:.2f} s -> target < {TARGET_S:g} s: "
        f"{benchlib.verdict(full < TARGET_S)}"
    )
    print(f"peak RSS of this process: {benchlib.self_peak_mib():.0f} MiB")


if __name__ == "__main__":
    main()
