"""The decision record: one document (HTML and PDF) that the PoC ends in.

Plain functions, no Prefect (the ``record`` flow wraps ``build_record``). Everything in it is
read from the committed datasets: the verdict rows are ``weekly_report_rows``
(tasks.window.weekly.rows) of the latest week with data (trial-based rows pool the
comparability segment to date), and every other figure comes from the rows named beside it.
Nothing is typed by hand.

By part: ``sources`` (what is read), ``mistakes`` (the six gates), ``method``, ``sections``
(one function per section), ``document`` (the blocks and their HTML and PDF renderings) and
``build`` (gathering, writing, the flow's markdown).
"""

from tasks.poc.record.build import build_record, record_markdown

__all__ = ["build_record", "record_markdown"]
