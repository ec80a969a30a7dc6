"""A plan's workloads: what runs, how its progress shows, and how a restored run is judged.

``Plan.workloads`` is a list of these (``workload:`` alone is the one-item form); the
comparisons (overhead, recovery, cold start) run on the first, ``Plan.workload``. The
compatibility stage (tasks/experiments/compatibility.py) takes every one of them through
checkpoint → kill → restore cycles and checks its ``fidelity`` against an uninterrupted
reference run. An example item::

    workloads:
      - name: gromacs-water
        prepare:                        # argv lists, run in {copy_dir} before the start
          - [gmx, solvate, -cs, spc216.gro, -box, "1.8", "1.8", "1.8", -o, water.gro]
          - [gmx, grompp, -f, md.mdp, -c, water.gro, -p, topol.top, -o, ref.tpr]
        command: [gmx, mdrun, -nt, "1", -s, "{copy_dir}/ref.tpr", -reprod]
        env: {OMP_NUM_THREADS: "1"}
        gpus: 0
        progress_probe: {log_regex: '^step (\\d+),'}
        app_checkpoint: {every_steps: 1000, path: "{copy_dir}/state.cpt"}
        fidelity:
          files:
            - {path: "{copy_dir}/ener.edr"}                       # exact digest
            - path: "{log}"                                       # the copy's own log
              numbers: {regex: 'Potential\\s+(?P<epot>\\S+)', rel_tol: 1.0e-9}
        criu:                           # checked against CRIU_DUMP_OPTIONS / _RESTORE_
          dump: [--tcp-established, --network-lock, nftables]
          restore: [--tcp-established]
      - name: redis
        command: [redis-server, --port, "{port}", --save, "", --dir, "{copy_dir}"]
        ready_probe: {tcp: "{port}"}    # or url, exec (argv), log (regex); or a progress_probe
        fidelity:
          query: [redis-cli, -p, "{port}", DBSIZE]        # same output before and after
          expect_same: true

Placeholders: ``{copy_dir}`` (each copy's own folder: command, env, prepare, paths, query),
``{port}`` (a free TCP port the harness picks per copy: command, env, ready probe, query;
not in the first workload, which recovery and overhead run without one; cold start picks
one for the workload it times, ``cold_start.workload``), ``{workdir}`` (the folder
workloads run from, where relative paths resolve: e.g. to copy an input from the repo in a
``prepare`` command, which runs in ``{copy_dir}``; compatibility stage only) and ``{log}``
(only as a fidelity file: the copy's stdout/stderr log) and ``{prepared}`` (a folder per
workload and PoC under the plan's data_dir, where ``prepare`` writes what every copy reads:
weights, a data set; tasks/engine/prepared.py). The comparisons run the first workload's
``prepare`` once per stage run, in ``{prepared}`` (its ``{copy_dir}`` is that folder too);
the compatibility stage runs each workload's ``prepare`` in each copy's folder.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from tasks.data.env_markers import PREFIX as ENV_MARKER_PREFIX
from tasks.data.plan_short_forms import OneOrList, ShortForm

COPY_DIR = "{copy_dir}"
PORT = "{port}"
LOG = "{log}"
WORKDIR = "{workdir}"
PREPARED = "{prepared}"
PLACEHOLDERS = (COPY_DIR, PORT, LOG, WORKDIR, PREPARED)

MAX_STEPS = 10**9  # the application's own checkpoint period, in steps
MAX_GPUS = 64  # GPUs per job
MAX_WORKLOADS = 32
MAX_CYCLES = 1000
MAX_PREPARE_COMMANDS = 16
MAX_FIDELITY_FILES = 64
MAX_ENV = 64
MAX_WORKLOAD_S = 24 * 3600  # one reference or managed run, prepare included

# A name that is safe as one argv element and as a hostname (tasks/data/plan.py re-exports).
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# The harness names each copy with these (samplers, attribution): a plan never sets them.
RESERVED_ENV_PREFIX = ENV_MARKER_PREFIX

# CRIU options a plan may add, and the values each takes (None: a flag; a tuple: one of
# those; "size": a byte count). Everything else is refused: the harness owns the process
# tree (-t), the folders (-D, -o, --pidfile), detaching (-d), what happens to the workload
# after a dump (--leave-running/--leave-stopped) and the action script. No option that names
# a file or a mount is allowed (blast radius: a plan never points CRIU at the host's files).
SIZE = "size"
CRIU_DUMP_OPTIONS: dict[str, tuple[str, ...] | str | None] = {
    "--tcp-established": None,
    "--tcp-close": None,
    "--skip-in-flight": None,
    "--network-lock": ("iptables", "nftables", "skip"),
    "--ext-unix-sk": None,
    "--file-locks": None,
    "--link-remap": None,
    "--ghost-limit": SIZE,
    "--shell-job": None,
    "--evasive-devices": None,
    "--force-irmap": None,
    "--manage-cgroups": ("none", "props", "soft", "full", "strict", "ignore"),
}
CRIU_RESTORE_OPTIONS: dict[str, tuple[str, ...] | str | None] = {
    "--tcp-established": None,
    "--tcp-close": None,
    "--network-lock": ("iptables", "nftables", "skip"),
    "--ext-unix-sk": None,
    "--file-locks": None,
    "--shell-job": None,
    "--evasive-devices": None,
    "--manage-cgroups": ("none", "props", "soft", "full", "strict", "ignore"),
}
_SIZE_VALUE = re.compile(r"^[0-9]{1,12}[KMG]?$")


class _Strict(BaseModel):
    # As every plan model: unknown keys refused, frozen, every float finite (plan.py).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _check_safe_name(value: str) -> str:
    if not SAFE_NAME.match(value):
        raise ValueError(
            f"{value!r} is not a safe name: use letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (no spaces or shell metacharacters)"
        )
    return value


# Its JSON Schema says the pattern too, so an editor flags a bad name as it is typed.
SafeName = Annotated[
    str,
    AfterValidator(_check_safe_name),
    WithJsonSchema({"type": "string", "pattern": SAFE_NAME.pattern}),
]


def _argv_list(value: Any, what: str) -> Any:
    if isinstance(value, str):
        raise ValueError(f"{what} must be an argv list (YAML list of strings), not a string")
    return value


def _compile(regex: str, what: str) -> re.Pattern[str]:
    try:
        return re.compile(regex, re.M)
    except re.error as exc:
        raise ValueError(f"{what} does not compile: {exc}") from exc


class ProgressProbe(_Strict):
    """Yields a step counter: a regex with one group over the workload's log, or a file."""

    log_regex: str | None = None
    file: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ProgressProbe:
        if (self.log_regex is None) == (self.file is None):
            raise ValueError("give exactly one of log_regex or file")
        if self.log_regex is not None:
            try:
                compiled = re.compile(self.log_regex)
            except re.error as exc:
                raise ValueError(f"log_regex does not compile: {exc}") from exc
            if compiled.groups < 1:
                raise ValueError("log_regex needs one capture group holding the step number")
        return self


# The kinds of ready probe, as Kubernetes offers them (a log line besides): exactly one per
# probe. tcp's HOST:PORT, with "{port}" alone meaning 127.0.0.1 on the copy's port.
READY_PROBE_KINDS = ("url", "tcp", "exec", "log")
_TCP = re.compile(
    r"^(?:(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):)?(?P<port>\{port\}|[0-9]{1,5})$"
)


class ReadyProbe(_Strict):
    """When a server is ready to serve: ``url`` answers 200 to a GET, ``tcp`` accepts a
    connection, ``exec`` (an argv, run on the copy's node) exits 0, or ``log`` (a regex)
    matches a line of the copy's log. A database, a cache or an MPI service that speaks no
    HTTP is timed by one of the last three."""

    url: str | None = None
    tcp: str | None = None
    exec: list[str] | None = Field(default=None, min_length=1)
    log: str | None = None

    @field_validator("url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^\s]+$", value):
            raise ValueError("ready probe url must be an http(s) URL")
        return value

    @field_validator("tcp")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is None:
            return value
        match = _TCP.match(value)
        if match is None or (match["port"] != PORT and not 0 < int(match["port"]) < 65536):
            raise ValueError(f"tcp: {value!r} is not HOST:PORT, PORT or {PORT}")
        return value

    @field_validator("exec", mode="before")
    @classmethod
    def _exec_argv(cls, value: Any) -> Any:
        return _argv_list(value, "exec")

    @field_validator("log")
    @classmethod
    def _log_regex(cls, value: str | None) -> str | None:
        if value is not None:
            _compile(value, "log")
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> ReadyProbe:
        given = [k for k in READY_PROBE_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(READY_PROBE_KINDS)}")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in READY_PROBE_KINDS if getattr(self, k) is not None)

    @property
    def words(self) -> list[str]:
        """Its words a copy's placeholders fill in (url, tcp, the exec argv)."""
        return [w for w in (self.url, self.tcp, *(self.exec or [])) if w is not None]

    def filled(self, fill: Callable[[str], str]) -> ReadyProbe:
        """This probe for one copy: ``fill`` applied to its words."""
        return self.model_copy(
            update={
                "url": fill(self.url) if self.url else None,
                "tcp": fill(self.tcp) if self.tcp else None,
                "exec": [fill(w) for w in self.exec] if self.exec else None,
            }
        )

    def describe(self) -> str:
        """One line naming it: `url http://…`, `tcp 127.0.0.1:6379`, `exec redis-cli …`."""
        value = " ".join(self.exec) if self.exec else getattr(self, self.kind)
        return f"{self.kind} {value}"


class AppCheckpoint(_Strict):
    """The application's own checkpoint: the unmanaged arm's recoverable point.

    ``path`` may use ``{copy_dir}``, as the command may: each workload copy gets its own
    folder, so the two arms never share a checkpoint file.
    """

    every_steps: int = Field(gt=0, le=MAX_STEPS, description="steps between checkpoints, ≤ 10⁹")
    path: str | None = None
    resume_args: list[str] = Field(
        default_factory=list, description="argv appended to restart from this checkpoint"
    )
    written_regex: str | None = Field(
        default=None,
        description="a log line the application prints once a checkpoint is in place, its "
        "step in the first group: the step a restart resumes at is the last one before the "
        "fault; without it, the last multiple of every_steps (a checkpoint the fault cut "
        "short is then taken as held, and the trial fails saying where the copy resumed)",
    )

    @field_validator("written_regex")
    @classmethod
    def _one_group(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            compiled = re.compile(value)
        except re.error as exc:
            raise ValueError(f"written_regex does not compile: {exc}") from exc
        if compiled.groups < 1:
            raise ValueError("written_regex needs one capture group holding the step number")
        return value


def fidelity_path_problem(path: str) -> str | None:
    """Why ``path`` is no fidelity file (None: it is one): ``{log}``, or a relative path
    under ``{copy_dir}/`` that never climbs out of it."""
    if path == LOG:
        return None
    if not path.startswith(COPY_DIR + "/"):
        return f"{path!r} is outside {COPY_DIR}: give '{COPY_DIR}/<file>' or '{LOG}'"
    rest = path[len(COPY_DIR) + 1 :]
    parts = rest.split("/")
    if not rest or any(p in ("", ".", "..") for p in parts) or "{" in rest:
        return f"{path!r} must name a file under {COPY_DIR} (no '..', '.', '//' or placeholder)"
    return None


class Numbers(_Strict):
    """Named numbers in a file: every match of ``regex`` (each capture group one number,
    named groups name them), compared in order with the reference run's within ``rel_tol``."""

    regex: str = Field(min_length=1)
    rel_tol: float = Field(default=0.0, ge=0, le=1, description="relative tolerance, 0..1")
    abs_tol: float = Field(default=0.0, ge=0, le=1e6, description="absolute tolerance, ≤ 10⁶")

    @field_validator("regex")
    @classmethod
    def _compiles(cls, value: str) -> str:
        if _compile(value, "regex").groups < 1:
            raise ValueError("regex needs at least one capture group holding a number")
        return value

    def pattern(self) -> re.Pattern[str]:
        return re.compile(self.regex, re.M)


class FidelityFile(_Strict):
    """One file the restored run must leave as the reference run did: the same bytes
    (no ``numbers``), or the same numbers within tolerance."""

    path: str
    numbers: Numbers | None = None

    @field_validator("path")
    @classmethod
    def _under_copy_dir(cls, value: str) -> str:
        problem = fidelity_path_problem(value)
        if problem:
            raise ValueError(problem)
        return value


def fidelity_file_form(value: Any) -> Any:
    """A bare path is its short form: that file under ``{copy_dir}`` compared byte for byte
    (a path already starting with a placeholder, or an absolute one, is kept as written, for
    the path check to take or refuse)."""
    if not isinstance(value, str):
        return value
    if value.startswith(("{", "/")):
        return {"path": value}
    return {"path": f"{COPY_DIR}/{value}"}


FidelityFileItem = Annotated[
    FidelityFile,
    ShortForm(
        fidelity_file_form,
        {
            "type": "string",
            "minLength": 1,
            "description": f"a file under {COPY_DIR} (or {LOG}), compared byte for byte",
        },
    ),
]


class Fidelity(_Strict):
    """How to tell a restored run from one never interrupted.

    ``files``: compared with the uninterrupted reference run's at the end (a bare path: that
    file under ``{copy_dir}``, byte for byte; tasks/data/plan_short_forms.py). ``query``: an
    argv (a service's client) whose output must be the same before each dump and after the
    restore (``expect_same``)."""

    files: Annotated[list[FidelityFileItem], OneOrList()] = Field(
        default_factory=list, max_length=MAX_FIDELITY_FILES
    )
    query: list[str] | None = Field(default=None, min_length=1)
    expect_same: bool = True
    query_timeout_s: float = Field(default=10, gt=0, le=600, description="one query, ≤ 600 s")

    @field_validator("query", mode="before")
    @classmethod
    def _argv(cls, value: Any) -> Any:
        return _argv_list(value, "query")

    @model_validator(mode="after")
    def _something(self) -> Fidelity:
        if not self.files and self.query is None:
            raise ValueError("give files (compared with a reference run) or a query (a service)")
        if self.query is not None and not self.expect_same:
            raise ValueError("expect_same: false checks nothing; leave the query out instead")
        return self


def criu_option_problems(argv: list[str], allowed: dict[str, Any], what: str) -> list[str]:
    """Each problem with one CRIU option list against its allow-list."""
    problems: list[str] = []
    i = 0
    seen: set[str] = set()
    while i < len(argv):
        option = argv[i]
        name, eq, inline = option.partition("=")
        if name not in allowed:
            harness = name in ("-t", "--tree", "-D", "--images-dir", "-o", "--log-file", "-d")
            why = "set by the harness" if harness else "not on the allow-list"
            problems.append(
                f"{what}: unknown CRIU option {option!r} ({why}); allowed: "
                + ", ".join(sorted(allowed))
            )
            i += 1
            continue
        if name in seen:
            problems.append(f"{what}: {name} given twice")
        seen.add(name)
        kind = allowed[name]
        if kind is None:
            if eq:
                problems.append(f"{what}: {name} takes no value")
            i += 1
            continue
        value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else None)
        i += 1 if eq else 2
        if value is None:
            problems.append(f"{what}: {name} needs a value")
        elif kind == SIZE and not _SIZE_VALUE.match(value):
            problems.append(f"{what}: {name} {value!r} is not a size (e.g. 1M)")
        elif isinstance(kind, tuple) and value not in kind:
            problems.append(f"{what}: {name} {value!r} is not one of {', '.join(kind)}")
    return problems


class CriuOptions(_Strict):
    """CRIU options this workload needs, added to the harness's own (allow-listed)."""

    dump: list[str] = Field(default_factory=list, max_length=32)
    restore: list[str] = Field(default_factory=list, max_length=32)

    @field_validator("dump")
    @classmethod
    def _dump_allowed(cls, value: list[str]) -> list[str]:
        problems = criu_option_problems(value, CRIU_DUMP_OPTIONS, "dump")
        if problems:
            raise ValueError("; ".join(problems))
        return value

    @field_validator("restore")
    @classmethod
    def _restore_allowed(cls, value: list[str]) -> list[str]:
        problems = criu_option_problems(value, CRIU_RESTORE_OPTIONS, "restore")
        if problems:
            raise ValueError("; ".join(problems))
        return value


def _prepare_form(value: Any) -> Any:
    """One argv (a list of strings) is the one-command form of a list of argv lists."""
    if isinstance(value, str):
        raise ValueError("prepare must be argv lists (YAML lists of strings), not a string")
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return [value]
    return value


class Workload(_Strict):
    name: SafeName
    command: list[str] | None = Field(default=None, min_length=1)
    script: str | None = None
    gpus: int = Field(ge=0, le=MAX_GPUS, description="GPUs per job, 0..64")
    progress_probe: ProgressProbe | None = None
    ready_probe: ReadyProbe | None = None
    app_checkpoint: AppCheckpoint | None = None
    production_owner: str | None = Field(
        default=None, description="who runs this workload in production (gate 3)"
    )
    # What the compatibility stage needs (the comparisons ignore these but `criu`, which
    # every CRIU dump and restore of this workload uses).
    fidelity: Fidelity | None = None
    criu: CriuOptions = Field(default_factory=CriuOptions)
    prepare: list[Annotated[list[str], Field(min_length=1)]] = Field(
        default_factory=list, max_length=MAX_PREPARE_COMMANDS
    )
    env: dict[str, str] = Field(default_factory=dict, max_length=MAX_ENV)

    @field_validator("command", mode="before")
    @classmethod
    def _argv(cls, value: Any) -> Any:
        return _argv_list(value, "command")

    @field_validator("prepare", mode="before")
    @classmethod
    def _prepare(cls, value: Any) -> Any:
        return _prepare_form(value)

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not an environment variable name")
            if name.startswith(RESERVED_ENV_PREFIX):
                raise ValueError(f"{name}: {RESERVED_ENV_PREFIX}* names are the harness's")
        return value

    @model_validator(mode="after")
    def _what_runs(self) -> Workload:
        if (self.command is None) == (self.script is None):
            raise ValueError("give exactly one of command (argv list) or script (path)")
        if self.progress_probe is None and self.ready_probe is None:
            raise ValueError("give a progress_probe (training) or a ready_probe (serving)")
        return self

    @property
    def uses_port(self) -> bool:
        """Whether a copy needs a free port picked for it (``{port}`` anywhere it runs)."""
        words = [*(self.command or []), *self.env.values()]
        words += [*(self.fidelity.query or [])] if self.fidelity else []
        words += self.ready_probe.words if self.ready_probe else []
        return any(PORT in w for w in words)


class Compatibility(_Strict):
    """The compatibility stage: how many checkpoint → kill → restore cycles per workload."""

    cycles: int = Field(default=10, ge=1, le=MAX_CYCLES, description="cycles per workload")
    timeout_s: float = Field(
        default=600,
        gt=0,
        le=MAX_WORKLOAD_S,
        description="one run of a workload (its prepare, reference or managed run), ≤ a day",
    )


def workloads_problems(workloads: list[Workload]) -> list[str]:
    """Problems across the list: names repeat; ``{port}`` in the first workload (the
    comparisons run it and pick no port)."""
    problems: list[str] = []
    names = [w.name for w in workloads]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        problems.append(f"workloads: names repeat: {', '.join(twice)}")
    if workloads and workloads[0].uses_port:
        problems.append(
            f"workloads.0: {PORT} is filled in by the compatibility stage only; the first "
            "workload is the one the comparisons run: give it a fixed port"
        )
    if workloads and any(WORKDIR in w for w in [*(workloads[0].command or [])]):
        problems.append(
            f"workloads.0.command: {WORKDIR} is filled in by the compatibility stage only; "
            "the first workload's command runs from the repo already: use a relative path"
        )
    return problems


_PROBLEM = re.compile(r"^(?P<here>.+?): (?P<field>workloads?)(?P<rest>(?:\.0)?[.:].*)$")


def without_alias_repeats(problems: list[str]) -> list[str]:
    """Problem lines without the repeats an anchored first workload causes: `workload` and
    `workloads.0` are then one mapping, and pydantic says each problem of it twice."""
    said = set()
    for line in problems:
        match = _PROBLEM.match(line)
        if match and match["field"] == "workload":
            said.add(match["rest"])
    out = []
    for line in problems:
        match = _PROBLEM.match(line)
        repeat = match and match["field"] == "workloads" and match["rest"].startswith(".0")
        if repeat and match["rest"][2:] in said:
            continue
        out.append(line)
    return out
