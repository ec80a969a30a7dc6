"""A Slurm plan's nodes checked against the cluster itself (``sinfo``), when it answers.

A node name with a typo passes every static check and then fails each trial it is given; one
``sinfo`` call at plan-check time turns that into a plan error naming the node. When ``sinfo``
is missing or does not answer (a laptop, a login node with the controller down), the check is
skipped and says so: the plan may be checked away from the cluster it is for.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# Long enough for a busy controller, short enough that `plan check` stays interactive.
SINFO_TIMEOUT_S = 10.0
# How many of sinfo's names a problem quotes; a large cluster lists thousands.
MAX_NAMES_QUOTED = 20


@dataclass(frozen=True)
class SlurmNodeCheck:
    """What sinfo said about the plan's nodes and partition.

    ``problems``: (field path, message) pairs, the path as in the plan (``("cluster",
    "nodes", 0)``) so the caller can point at the YAML line. ``skipped``: why nothing was
    checked (sinfo absent or silent), else None.
    """

    problems: list[tuple[tuple[str | int, ...], str]] = field(default_factory=list)
    skipped: str | None = None
    # Each node sinfo listed, with the partitions it is in.
    partitions_by_node: dict[str, set[str]] = field(default_factory=dict)


def _quoted(names: Sequence[str]) -> str:
    shown = ", ".join(names[:MAX_NAMES_QUOTED])
    more = len(names) - MAX_NAMES_QUOTED
    return f"{shown}, … and {more} more" if more > 0 else shown or "(none)"


def parse_sinfo_nodes(output: str) -> dict[str, set[str]]:
    """``sinfo -h -N -o '%N %P'`` lines → {node: its partitions} (the default's ``*`` dropped)."""
    partitions_by_node: dict[str, set[str]] = {}
    for line in output.splitlines():
        words = line.split()
        if not words:
            continue
        partitions = partitions_by_node.setdefault(words[0], set())
        if len(words) > 1:
            partitions.add(words[1].rstrip("*"))
    return partitions_by_node


def _run_sinfo(
    argv: list[str], env: Mapping[str, str] | None, timeout_s: float
) -> tuple[str | None, str | None]:
    """(stdout, None) when sinfo answered, else (None, why not)."""
    try:
        done = subprocess.run(
            argv,
            env=None if env is None else dict(env),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except FileNotFoundError:
        return None, f"{argv[0]} is not on PATH"
    except subprocess.TimeoutExpired:
        return None, f"{argv[0]} did not answer within {timeout_s:g} s"
    except OSError as exc:
        return None, f"{argv[0]} could not run: {exc}"
    if done.returncode != 0:
        # The last line says why (e.g. "Could not establish a configuration source").
        detail = (done.stderr.strip() or done.stdout.strip()).splitlines()
        return None, f"{argv[0]} exited {done.returncode}: {detail[-1] if detail else 'no output'}"
    return done.stdout, None


def check_slurm_nodes(
    nodes: Sequence[str],
    partition: str | None,
    *,
    sinfo: Sequence[str] = ("sinfo",),
    env: Mapping[str, str] | None = None,
    timeout_s: float = SINFO_TIMEOUT_S,
) -> SlurmNodeCheck:
    """Check that sinfo lists every node in ``nodes`` and, given a partition, in that partition.

    ``sinfo`` is the argv prefix that runs sinfo (tests point it at their cluster with ``env``
    carrying ``SLURM_CONF``). One call, ``-N`` (one line per node and partition) with ``%N
    %P``, answers both "is the node known" (the nodes ``sinfo -h -N -o %N`` lists) and "is it
    in the partition" (``%P``). ``--all`` includes hidden partitions: the PoC's partition may be
    hidden from ordinary users, and that must not read as "unknown".
    """
    output, skipped = _run_sinfo([*sinfo, "--all", "-h", "-N", "-o", "%N %P"], env, timeout_s)
    if output is None:
        return SlurmNodeCheck(skipped=skipped)
    partitions_by_node = parse_sinfo_nodes(output)
    known_nodes = sorted(partitions_by_node)
    problems: list[tuple[tuple[str | int, ...], str]] = []

    partition_exists = True
    if partition is not None and not any(partition in p for p in partitions_by_node.values()):
        # A partition without nodes is absent from -N's lines: ask for the partitions
        # themselves before calling it unknown.
        listed, _ = _run_sinfo([*sinfo, "--all", "-h", "-o", "%P"], env, timeout_s)
        known_partitions = sorted({word.rstrip("*") for word in (listed or "").split()})
        partition_exists = partition in known_partitions
        if not partition_exists:
            problems.append(
                (
                    ("cluster", "queue"),
                    f"partition {partition!r} is not in this Slurm cluster "
                    f"(sinfo lists: {_quoted(known_partitions)})",
                )
            )
    for i, node in enumerate(nodes):
        if node not in partitions_by_node:
            problems.append(
                (
                    ("cluster", "nodes", i),
                    f"node {node!r} is not in this Slurm cluster (sinfo lists: "
                    f"{_quoted(known_nodes)})",
                )
            )
        # An unknown partition is one problem already, not one more per node.
        elif partition_exists and partition not in (None, *partitions_by_node[node]):
            problems.append(
                (
                    ("cluster", "nodes", i),
                    f"node {node!r} is not in partition {partition!r} (sinfo lists it "
                    f"in: {_quoted(sorted(partitions_by_node[node]))})",
                )
            )
    return SlurmNodeCheck(problems=problems, partitions_by_node=partitions_by_node)
