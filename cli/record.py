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
        write_json({k: result[k] for k in JSON_KEYS})
        return
    out.print(f"decision: {result['decision']}: {result['decision_reason']}", highlight=False)
    for o in result["decision_detail"]["open"]:
        out.print(f"  to settle {o['criterion']}: {o['settle']} ({o['basis']})", highlight=False)
    for measure, verdict in result["verdicts"].items():
        out.print(f"{measure}: {verdict}", highlight=False)
    failed = [g for g, s in result["gates"].items() if not s["passed"]]
    out.print(f"gates failed: {', '.join(failed) or 'none'}; way out: {result['exit']}")
    out.print(f"HTML {result['html']}\nPDF  {result['pdf']}", highlight=False)
