"""One exception tree for the whole product, rooted at CkptPocError."""

from __future__ import annotations


class CkptPocError(Exception):
    """Base of every error ckpt-poc raises on purpose."""

    # True for an error that is a verdict on rows the run wrote (a failed gate, a run stopped
    # early): the run is complete and refused. Other errors mean the run could not finish.
    refuses_run = False

    def refusal(self) -> str:
        """The commit record's outcome when this error refuses a run that wrote rows."""
        return f"refused: {str(self)[:300]}"

    def __repr__(self) -> str:
        # Prefect logs a failed run's exception with repr(): "Name: message" keeps the
        # message's lines as lines in the UI instead of one quoted string with "\n"s.
        return f"{type(self).__name__}: {self}"


class PlanError(CkptPocError):
    """The PoC plan is missing, unreadable or invalid.

    ``problems`` holds one line per problem: ``file:line: field.path: message``.
    """

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        super().__init__(f"{path}: {len(problems)} problem(s)\n" + "\n".join(problems))


class AccountingError(CkptPocError):
    """Accounting input that cannot be read at all (single bad rows are quarantined)."""


class DatasetError(CkptPocError):
    """A dataset write or read that violates its declaration."""


class GateFailed(CkptPocError):
    """A comparability gate failed: the report it guards is blocked."""

    refuses_run = True

    def __init__(self, gate: str, failures: list[str]) -> None:
        self.gate = gate
        self.failures = failures
        super().__init__(f"gate {gate!r} failed:\n" + "\n".join(f"  - {f}" for f in failures))

    def refusal(self) -> str:
        return f"refused: gate {self.gate!r} failed"  # its gate rows are the record


class SecretError(CkptPocError):
    """A required secret (e.g. the pseudonymisation key) is not available."""


class BlastRadiusError(CkptPocError):
    """An action targeted something the plan (or this run) does not name."""
