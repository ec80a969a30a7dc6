"""A kill with a notice on the local engine (`sigterm-grace`), real CRIU, both arms.

At the notice the managed arm's checkpointer dumps at once; with a grace period that holds the
dump, the managed copy comes back exactly at the step its notice checkpoint held (nothing lost
but the dump's own moment). A grace period shorter than the dump is a missed deadline: the
dump is cut, the copy is killed at the deadline, and it comes back from its last periodic
checkpoint, work lost counted from there, never reported as a success of the notice.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tasks.data.errors import PlanError
from tasks.data.plan import load_plan
from tests.support.common import demo_plan_dict

pytestmark = pytest.mark.criu


def test_plan_check_wants_a_grace_period_with_a_notice_fault_only(tmp_path: Path) -> None:
    plan = demo_plan_dict()
    plan["faults"] = [{"kind": "sigterm-grace"}, {"kind": "sigkill", "grace_s": 5}]
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False))
    with pytest.raises(PlanError) as bad:
        load_plan(path)
    text = str(bad.value)
    assert "faults.0.grace_s: a sigterm-grace fault needs its grace period" in text
    # A field on the wrong kind is the schema's error, naming the field and the kind.
    assert "faults.1.grace_s: a sigkill fault has no grace_s (only sigterm-grace," in text
