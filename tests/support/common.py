"""Paths and constants the tests share."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


HEADER = (
    "JobID|JobIDRaw|Cluster|Partition|User|Account|JobName|State|ExitCode|Submit|Start|End|"
    "Elapsed|ElapsedRaw|Timelimit|NNodes|NCPUS|AllocTRES|NodeList"
)


def demo_plan_dict() -> dict:
    return yaml.safe_load((REPO / "plans" / "demo.yaml").read_text())
