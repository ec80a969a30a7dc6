"""What the flows hand on where tasks/ has no type for it: a stage's result with the run that
made it, the PoC's progress, the window's schedules switched on.

Frozen and typed; ``to_json`` (tasks/data/jsonform.py) gives each its JSON form, the keys
`--json` prints, in their order. The stage types are named for the type checker only: a flow
imports the stage it runs, and the CLI imports none at start-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tasks.data.jsonform import JsonForm

if TYPE_CHECKING:
    from tasks.exit.exit_result import ExitDiff
    from tasks.exit.install_result import InstallResult, UninstallResult
    from tasks.poc.progress import PocState
    from tasks.poc.record.build import DecisionRecord
    from tasks.window.weekly.stage import WeeklyReport


class SpreadForm(JsonForm):
    """A JsonForm whose ``_SPREAD`` fields give their own keys to its JSON form, in their
    place, rather than nesting under the field's name: the run's keys (poc, run_id) sit
    beside the stage result's, as the flows' results always had them."""

    _SPREAD: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:  # a dict: the JSON form itself
        out: dict[str, Any] = {}
        for key, value in super().to_json().items():
            if key in self._SPREAD:
                out.update(value)
            else:
                out[key] = value
        return out


@dataclass(frozen=True, slots=True)
class UtilizationResult(JsonForm):
    """The utilization run: one row per arm, week and workload (flows/utilization.COLUMNS,
    NaN read as None)."""

    poc: str
    run_id: str
    week: str | None  # None: every week
    rows: list[dict[str, Any]]  # a dict a row: the table artifact's and --json's rows


@dataclass(frozen=True, slots=True)
class WeeklyReportRun(SpreadForm):
    """The weekly report with the run that built it."""

    _SPREAD = ("report",)

    poc: str
    run_id: str
    report: WeeklyReport


@dataclass(frozen=True, slots=True)
class RecordSummary(JsonForm):
    """What `poc` keeps of the decision record it built: the verdicts, the decision, the
    files."""

    html: str
    pdf: str
    verdicts: Mapping[str, str]  # measure → verdict
    decision: str
    decision_reason: str


@dataclass(frozen=True, slots=True)
class RecordRun(SpreadForm):
    """The decision record with the run that wrote it."""

    _SPREAD = ("record",)

    poc: str
    run_id: str
    record: DecisionRecord

    def summary(self) -> RecordSummary:
        """The verdicts, the decision and the files."""
        r = self.record
        return RecordSummary(r.html, r.pdf, r.verdicts, r.decision, r.decision_reason)


@dataclass(frozen=True, slots=True)
class ExitVerdict(JsonForm):
    """What `poc` keeps of the way out it ran: the verdict, the leftovers and the nodes' own
    changes (the items as the stage's result gives them)."""

    verdict: str
    leftovers: list[dict[str, Any]]  # a dict an item: node, kind, key, change, … reason
    node_own: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class ExitDiffRun(SpreadForm):
    """An exit diff with the run that made it (its id last, as the result always had it)."""

    _SPREAD = ("diff",)

    diff: ExitDiff
    run_id: str

    def exit_verdict(self) -> ExitVerdict:
        """'clean' or 'leftovers', every item as written."""
        return ExitVerdict(self.diff.verdict, self.diff.leftovers, self.diff.node_own)


@dataclass(frozen=True, slots=True)
class InstallRun(JsonForm):
    """What install put on each node, and the run that did it."""

    poc: str
    run_id: str
    nodes: InstallResult


@dataclass(frozen=True, slots=True)
class UninstallRun(JsonForm):
    """The way out: each node's uninstall, then the before_install → after_uninstall diff.
    ``verdict`` is 'clean' or 'leftovers: N'; the items are exit_diff.json_form's."""

    poc: str
    run_id: str
    steps: UninstallResult
    verdict: str
    leftovers: list[dict[str, Any]]  # a dict an item: node, kind, key, change, … reason
    node_own: list[dict[str, Any]]

    def exit_verdict(self) -> ExitVerdict:
        """'clean' or 'leftovers: N', the items as exit_diff.json_form gives them."""
        return ExitVerdict(self.verdict, self.leftovers, self.node_own)


@dataclass(frozen=True, slots=True)
class WindowStart(JsonForm):
    """The window's schedules switched on: how many per deployment, the deployments this
    Prefect API lacks, and why none could be (no API reachable), when so."""

    _OMIT_NONE = ("error",)

    activated: Mapping[str, int]
    missing: tuple[str, ...]
    error: str | None = None


@dataclass(frozen=True, slots=True)
class PocRun(JsonForm):
    """One run of the `poc` flow: the stages it ran and skipped, where it stopped, what the
    way out and the record said when it ran them, and where the PoC stands now. ``exit``,
    ``record`` and ``window`` are absent, not null, when this run did not reach them."""

    _OMIT_NONE = ("exit", "record", "window")

    poc: str
    ran: tuple[str, ...]
    skipped: tuple[str, ...]  # done before this run started
    exit: ExitVerdict | None
    record: RecordSummary | None
    stopped: str  # complete | after STAGE | window
    window: WindowStart | None
    state: PocState
