"""`ckpt-poc record PLAN`: the decision record, HTML and PDF."""

from __future__ import annotations

from cli.common import JsonOpt, PlanArg, command_body, out, write_json

JSON_KEYS = ("html", "pdf", "decision", "decision_reason", "verdicts", "gates", "exit")


def record_cmd(plan: PlanArg, as_json: JsonOpt = False) -> None:
    """Write the decision record (HTML and PDF) from the committed datasets."""
    with command_body():
        from flows.record import record

        result = record(str(plan))
    if as_json:
        shown = result.to_json()
        write_json({k: shown[k] for k in JSON_KEYS})
        return
    built = result.record
    out.print(f"decision: {built.decision}: {built.decision_reason}", highlight=False)
    for o in built.decision_detail["open"]:
        out.print(f"  to settle {o['criterion']}: {o['settle']} ({o['basis']})", highlight=False)
    for measure, verdict in built.verdicts.items():
        out.print(f"{measure}: {verdict}", highlight=False)
    failed = [g for g, s in built.gates.items() if not s["passed"]]
    out.print(f"gates failed: {', '.join(failed) or 'none'}; way out: {built.exit}")
    out.print(f"HTML {built.html}\nPDF  {built.pdf}", highlight=False)
