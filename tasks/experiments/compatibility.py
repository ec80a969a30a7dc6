"""The compatibility stage: every workload of the plan through N checkpoint → kill → restore
cycles, then its fidelity against an uninterrupted reference run.

Per workload (``workloads:``), on the plan's first local slot (on Slurm: the same, inside a
job of its own on the plan's first node, tasks/experiments/backends/slurm/sweep.py):

1. the reference run: ``prepare`` in its own folder, then the command, uninterrupted, to
   its end (a job) or until ready and queried (a service, ``ready_probe`` and no progress
   probe); what the fidelity check needs must be there (else bad input, naming the field);
2. the managed run, in a folder of its own: cycle k is aimed at step ``final·k/(N+1)`` of
   the reference's ``final`` step (a service: every ``SERVICE_GAP_S``), at one moment in turn
   (tasks/experiments/compatibility_cycle.py: its own checkpoint, I/O, a periodic
   checkpoint left running then a fault, steady); CRIU dumps it with the workload's options
   only (``workload.criu``; none of the comparisons' ``--tcp-close``), which ends it (or a
   kill does, after a periodic one); once every dumped pid left /proc it is restored and must
   log a new step (a service: answer its ready probe). A copy whose restore failed cannot go
   on: the next cycle runs on a fresh copy (``managed-2``…), and fidelity is that copy's;
3. fidelity: the files compared with the reference's, the query's output after each
   restore with its output before the dump.

A workload CRIU cannot checkpoint is a result (its cycles failed, with CRIU's own line);
bad input is that workload's result, naming the field; the other workloads still run.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from tasks.data.arms import MANAGED, UNMANAGED
from tasks.data.errors import CkptPocError
from tasks.data.fingerprint import tool_version_of
from tasks.data.plan import Plan, Workload
from tasks.data.plan_workload import COPY_DIR
from tasks.data.runctx import RunContext
from tasks.engine.checkpointers.criu import CriuCheckpointer, clean_dead_roots
from tasks.engine.checkpointers.criu_gpu import GpuCriuCheckpointer, gpu_checkpointer
from tasks.engine.clock import EventRecorder
from tasks.engine.clusters.process import MachineSlots, WorkloadProcess
from tasks.engine.clusters.registry import BUILT_KINDS, process_slots
from tasks.engine.paths import images_folder, images_roots, prepared_root, run_folder
from tasks.engine.preflight import log_tail
from tasks.engine.probes import (
    LogProgressProbe,
    StepSeen,
    compile_progress,
    last_step_before,
    steps_in,
)
from tasks.engine.ready import wait_ready
from tasks.experiments.compatibility_copy import Copy, make_copy, run_prepare, run_query
from tasks.experiments.compatibility_cycle import (
    CycleRecord,
    dump_and_end,
    dump_run_on_and_end,
    moment_of,
    restore_copy,
    wait_for_moment,
)
from tasks.experiments.compatibility_fidelity import BadInput, check_reference, compare_files

SERVICE_GAP_S = 0.3  # between a service's cycles
IO_WAIT_S = 2.0  # longest wait for a write before an `io` cycle dumps anyway
KEEP = 2  # checkpoints kept per managed copy: the one restored and the next
# After a query, before the dump: the service closes the query's connection first (a dump
# then sees its listening socket only, as between any two requests).
QUERY_SETTLE_S = 0.05


class CompatibilityRefused(CkptPocError):
    """The plan cannot run this stage here (cluster or checkpointer kind)."""


@dataclass
class WorkloadSweep:
    """What one workload went through: its cycles, fidelity, or why it was not tried."""

    name: str
    started_at: dt.datetime
    cycles: list[CycleRecord] = field(default_factory=list)
    fidelity: str = "not checked"
    fidelity_detail: str = ""
    error: str | None = None  # bad input or a copy that would not start: names the field
    notes: list[str] = field(default_factory=list)
    reference_s: float | None = None
    final_step: int | None = None


@dataclass
class Sweep:
    """What every workload's sweep shares."""

    cluster: MachineSlots
    recorder: EventRecorder
    run_dir: Path
    slot: str
    cycles: int
    timeout_s: float
    prepared_root: Path  # data_dir/poc/prepared: each workload's {prepared} is a folder in it
    images_dir: str | None = None  # the plan's checkpointer.images_dir
    gpu: bool = False  # checkpointer.gpu: each copy's GPU state toggled around its dumps

    def images(self, copy: Copy) -> Path:
        """Where a copy's checkpoint images go (tasks/engine/paths.images_folder)."""
        poc_root = self.prepared_root.parent
        return images_folder(copy.copy_dir, self.images_dir, poc_root.parent, poc_root.name)

    def copy(self, w: Workload, index: int, name: str) -> Copy:
        prepared = self.prepared_root / w.name
        return make_copy(
            w, f"workloads.{index}", name, self.run_dir, self.cluster.workdir, prepared
        )


def ensure_compatibility_runs(plan: Plan) -> None:
    if plan.cluster.kind not in BUILT_KINDS or plan.checkpointer.kind != "criu":
        raise CompatibilityRefused(
            f"the compatibility stage runs on cluster.kind {' or '.join(map(repr, BUILT_KINDS))}"
            f" with checkpointer 'criu' (this plan: {plan.cluster.kind!r}, "
            f"{plan.checkpointer.kind!r})"
        )


def chosen_workloads(plan: Plan, only: list[str] | None) -> list[tuple[int, Workload]]:
    """The plan's workloads (index, workload) the sweep takes: all, or those in ``only``."""
    unknown = sorted(set(only or []) - {w.name for w in plan.workloads})
    if unknown:
        raise CompatibilityRefused(f"no workload named {', '.join(unknown)} in the plan")
    return [(i, w) for i, w in enumerate(plan.workloads) if only is None or w.name in only]


def _wait_step(
    probe: LogProgressProbe, proc: WorkloadProcess, after: int, at_least: int, timeout: float
) -> StepSeen | None:
    """The first step ≥ ``at_least`` logged past byte ``after``, while the copy lives."""
    deadline = time.monotonic() + timeout

    def wanted(s: StepSeen) -> bool:
        return s.offset > after and s.step >= at_least

    while time.monotonic() < deadline:
        seen = probe.wait_for(wanted, 0.05)
        if seen is not None:
            return seen
        if not proc.alive():
            return probe.wait_for(wanted, 0.3)  # lines written just before the end
    return None


def _wait_exit(cluster: MachineSlots, proc: WorkloadProcess, timeout: float) -> int | None:
    """The copy's exit status (its launcher's, which `unshare --fork` passes on); None if
    it still runs after ``timeout``, or was restored (no parent here to tell)."""
    if not cluster.wait_gone(proc, timeout):
        return None
    return proc.launcher.wait() if proc.launcher is not None else None


def _reference_job(sweep: Sweep, w: Workload, index: int, out: WorkloadSweep) -> Copy:
    """The uninterrupted run; sets ``final_step``; raises BadInput on what cannot be used."""
    ref = sweep.copy(w, index, "reference")
    run_prepare(ref, sweep.timeout_s)
    t0 = time.monotonic()
    proc = sweep.cluster.start(sweep.slot, UNMANAGED, ref.argv, ref.env, tag=f"{w.name}-ref")
    rc = _wait_exit(sweep.cluster, proc, sweep.timeout_s)
    if rc is None:
        raise BadInput(
            f"{ref.field}.command",
            f"the reference run did not end within {sweep.timeout_s:.0f} s "
            "(compatibility.timeout_s)",
        )
    out.reference_s = time.monotonic() - t0
    if rc != 0:
        tail = log_tail(proc.log, 5) or "(the log is empty)"
        raise BadInput(f"{ref.field}.command", f"the reference run exited {rc}: {tail}")
    regex = _log_regex(w, ref.field)
    steps = steps_in(proc.log.read_text(errors="replace"), compile_progress(regex))
    if not steps:
        raise BadInput(f"{ref.field}.progress_probe.log_regex", "the reference run logged no step")
    out.final_step = steps[-1]
    if w.fidelity is not None:
        check_reference(w.fidelity, ref.files(proc.log), f"{ref.field}.fidelity")
    return ref


def _log_regex(w: Workload, where: str) -> str:
    if w.progress_probe is None or w.progress_probe.log_regex is None:
        raise BadInput(f"{where}.progress_probe", "the compatibility stage follows a log_regex")
    return w.progress_probe.log_regex


def _target(w: Workload, cycle: int, cycles: int, final: int, moment: str) -> int:
    """The step cycle ``cycle`` waits for: spread over the run; an own-checkpoint cycle
    waits from the step before the application's next checkpoint step."""
    target = max(1, math.floor(final * cycle / (cycles + 1)))
    if moment == "app-checkpoint" and w.app_checkpoint is not None:
        every = w.app_checkpoint.every_steps
        step = math.ceil(target / every) * every
        if step >= final:  # not the last one: past it the copy has no step left to resume
            step = math.floor(target / every) * every
        target = max(1, step - 1) if step > 0 else target
    return target


def _checkpoint_file(copy: Copy) -> Path | None:
    app = copy.workload.app_checkpoint
    if app is None or app.path is None or COPY_DIR not in app.path:
        return None
    return Path(copy.fill(app.path))


@dataclass
class Managed:
    """The managed copy now taken through cycles, and what follows it."""

    copy: Copy
    proc: WorkloadProcess
    criu: CriuCheckpointer | GpuCriuCheckpointer
    probe: LogProgressProbe | None
    log: Path
    after: int = 0  # log bytes before the last restore: only steps past them are new
    final_step: int | None = None  # the reference run's last step
    restored: int = 0  # cycles of this copy restored: none, and its end shows nothing

    def close(self) -> None:
        if self.probe is not None:
            self.probe.stop()
        self.criu.close()


def _start_managed(sweep: Sweep, w: Workload, index: int, n: int) -> Managed:
    copy = sweep.copy(w, index, f"managed-{n}")
    run_prepare(copy, sweep.timeout_s)
    trial = f"compat-{w.name}"
    criu = CriuCheckpointer(
        sweep.images(copy),
        KEEP,
        sweep.recorder,
        trial,
        MANAGED,
        timeout_s=min(sweep.timeout_s, 600),
        dump_options=w.criu.dump,
        restore_options=w.criu.restore,
        harness_options=False,
    )
    # A GPU plan's copies: a restore the capability check refuses is a cycle's result.
    taker = gpu_checkpointer(criu) if sweep.gpu else criu
    proc = sweep.cluster.start(sweep.slot, MANAGED, copy.argv, copy.env, tag=f"{w.name}-m{n}")
    probe = None
    if not is_service(w):
        regex = _log_regex(w, copy.field)
        probe = LogProgressProbe(proc.log, regex, sweep.recorder, trial, MANAGED).start()
    return Managed(copy, proc, taker, probe, proc.log)


def is_service(w: Workload) -> bool:
    """A service runs until stopped: it has a query to ask, or no progress to follow."""
    return (w.fidelity is not None and w.fidelity.query is not None) or w.progress_probe is None


def service_ready(sweep: Sweep, copy: Copy, proc: WorkloadProcess, arm: str, after: int) -> str:
    """Wait until the service works: its ready probe says ready, else its fidelity query
    exits 0, else it logs a progress line past ``after``. '' when it does, else why not."""
    trial = f"compat-{copy.workload.name}"
    ready = copy.ready_probe
    if ready is not None:
        answer = wait_ready(
            ready, sweep.recorder, trial, arm,
            timeout=sweep.timeout_s, alive=proc.alive, log=proc.log, after_offset=after,
        )  # fmt: skip
        if answer.ready:
            return ""
        return (
            f"its ready probe ({ready.describe()}) never said ready within "
            f"{sweep.timeout_s:.0f} s; its last answer: {answer.last}"
        )
    w = copy.workload
    deadline = time.monotonic() + sweep.timeout_s
    if w.fidelity is not None and w.fidelity.query is not None:
        answer = ""
        while time.monotonic() < deadline and proc.alive():
            answer = run_query(copy, "a start")
            if answer.startswith("exit 0\n"):
                return ""
            time.sleep(0.1)
        return f"its query never exited 0 within {sweep.timeout_s:.0f} s ({answer[:80]!r})"
    regex = _log_regex(w, copy.field)
    probe = LogProgressProbe(proc.log, regex, sweep.recorder, trial, arm).start()
    try:
        seen = _wait_step(probe, proc, after, 0, sweep.timeout_s)
    finally:
        probe.stop()
    return "" if seen is not None else f"no progress line within {sweep.timeout_s:.0f} s"


def _resumed(sweep: Sweep, m: Managed, new: WorkloadProcess, record: CycleRecord) -> bool:
    """Whether the restored copy works again: a new step (a job), or it answers (a
    service)."""
    if is_service(m.copy.workload):
        why = service_ready(sweep, m.copy, new, MANAGED, m.after)
        if not why:
            return True
        what = why
    else:
        assert m.probe is not None
        seen = _wait_step(m.probe, new, m.after, 0, sweep.timeout_s)
        if seen is not None:
            record.resumed_step = seen.step
            return True
        # Frozen after its last step, it had only its end left to do: ended is resumed.
        last, frozen = m.final_step, record.step
        if not new.alive() and last is not None and frozen is not None and frozen >= last:
            return True
        what = f"no new step within {sweep.timeout_s:.0f} s"
    state = "still running" if new.alive() else "exited"
    tail = log_tail(m.log, 3, after_offset=m.after).replace("\n", " | ")
    record.cause = f"restored, then {what} ({state}): {tail or 'nothing logged'}"
    return False


# long: one cycle's steps in order (aim, query, dump, restore, resume, query), each a few lines
def run_cycle(sweep: Sweep, m: Managed, record: CycleRecord, query: bool) -> bool:
    """Take the copy through one cycle; False when it cannot go on (restore failed)."""
    w = m.copy.workload
    if record.target_step is not None and m.probe is not None:
        if _wait_step(m.probe, m.proc, m.after, record.target_step, sweep.timeout_s) is None:
            raise _Ended(m, record)
    else:
        time.sleep(SERVICE_GAP_S)
    before = run_query(m.copy, "the managed run") if query else None
    if query:
        time.sleep(QUERY_SETTLE_S)
    ckpt_file = _checkpoint_file(m.copy)
    deadline = time.monotonic() + IO_WAIT_S
    if record.moment == "app-checkpoint" and m.probe is not None and w.app_checkpoint:
        passed = record.target_step + 1 if record.target_step is not None else 0
        probe = m.probe

        def give_up() -> bool:  # its checkpoint step went by with no file seen open
            last = probe.last
            return last is not None and last.step > passed
    else:

        def give_up() -> bool:
            return time.monotonic() > deadline

    if record.moment == "app-checkpoint" and ckpt_file is None and m.probe is not None:
        # No file to watch: dump as its checkpoint step is logged (caught: not checkable).
        at = (record.target_step or 0) + 1
        caught, found = None, None
        _wait_step(m.probe, m.proc, m.after, at, sweep.timeout_s)
    else:
        caught, found = wait_for_moment(record.moment, m.proc, ckpt_file, give_up)
    record.caught = caught
    if not m.proc.alive():
        raise _Ended(m, record)
    latest = m.probe.latest() if m.probe is not None else None  # a fresh read, not the last
    if latest is not None:
        record.step = latest.step  # as the dump starts; the frozen log's step below
    if record.moment == "periodic":
        point = dump_run_on_and_end(m.criu, sweep.cluster, m.proc, record, m.log)
    else:
        point = dump_and_end(m.criu, sweep.cluster, m.proc, record, found)
    if point is None:
        if not m.proc.alive():
            raise _Ended(m, record)
        return True  # the copy runs on: the next cycle tries again
    if m.probe is not None and point.held_log_bytes is not None:
        regex = m.probe.pattern
        record.step = last_step_before(m.log, point.held_log_bytes, regex)
    m.after = m.log.stat().st_size
    new = restore_copy(
        m.criu, sweep.cluster, sweep.slot, point, m.log, record, stopped=found is not None
    )
    if new is None:
        return False
    if not _resumed(sweep, m, new, record):
        record.restore = "failed"
        sweep.cluster.kill(new)
        sweep.cluster.wait_gone(new)
        return False
    record.restore = "ok"
    m.proc = new
    m.restored += 1
    if query:
        after = run_query(m.copy, "the managed run")
        record.query = "same" if after == before else "differs"
    return True


class _Ended(Exception):
    """The copy ended (its work done) before a cycle could dump it: no more cycles."""

    def __init__(self, m: Managed, record: CycleRecord) -> None:
        last = m.probe.last.step if m.probe is not None and m.probe.last else None
        target = record.target_step
        # Steps well past the target, yet seen too late: lines the probe could not follow as
        # they were written, read only at the end. The target step itself is no sign of that:
        # a copy can print it and end before the dump (a race, seen on a loaded box).
        self.unseen = last is not None and target is not None and last > target
        if self.unseen:
            message = (
                f"its steps were seen only once it ended (last step {last}, cycle "
                f"{record.cycle} waited for step {target}): the progress probe reads lines "
                "ended by a newline, as they are written"
            )
        else:
            how = "went silent" if m.proc.alive() else "ended"
            message = (
                f"cycles {record.cycle}.. not run: the workload {how} (last step {last}) "
                f"before cycle {record.cycle} at step {target}"
            )
        super().__init__(message)


def _fidelity(
    out: WorkloadSweep, w: Workload, ref: Copy | None, ref_log: Path | None, m: Managed
) -> None:
    """The file checks against the reference, and the query's verdicts over the cycles."""
    parts: list[str] = []
    verdicts: list[str] = []
    if m.restored == 0:  # every dump failed (or none restored): its files are an uncut run's
        out.fidelity_detail = f"not checked: no cycle of copy {m.copy.name} was restored"
        return
    if w.fidelity is not None and w.fidelity.files and ref is not None and ref_log is not None:
        overall, files = compare_files(
            w.fidelity, ref.files(ref_log), m.copy.files(m.log), f"{ref.field}.fidelity"
        )
        verdicts.append(overall)
        parts += [f"{f.path}: {f.verdict} ({f.detail})" for f in files]
    queried = [c.query for c in out.cycles if c.query is not None]
    if queried:
        differs = queried.count("differs")
        verdicts.append("differs" if differs else "same")
        parts.append(
            f"query: {len(queried) - differs} of {len(queried)} restores answered the same"
        )
    if verdicts:
        out.fidelity = "differs" if "differs" in verdicts else "same"
    out.fidelity_detail = "; ".join(parts) + (f" (copy {m.copy.name})" if parts else "")


def _reference_service(sweep: Sweep, w: Workload, index: int) -> Copy:
    """Started, working (its query answering too), stopped."""
    ref = sweep.copy(w, index, "reference")
    run_prepare(ref, sweep.timeout_s)
    proc = sweep.cluster.start(sweep.slot, UNMANAGED, ref.argv, ref.env, tag=f"{w.name}-ref")
    try:
        why = service_ready(sweep, ref, proc, UNMANAGED, 0)
        if why:
            tail = log_tail(proc.log, 3).replace("\n", " | ") or "(the log is empty)"
            field_ = f"ready_probe.{w.ready_probe.kind}" if w.ready_probe else "command"
            raise BadInput(f"{ref.field}.{field_}", f"the reference run: {why}: {tail}")
        if w.fidelity is not None and w.fidelity.query is not None:
            run_query(ref, "the reference run")
    finally:
        sweep.cluster.kill(proc)
        sweep.cluster.wait_gone(proc)
    return ref


def _fresh(sweep: Sweep, w: Workload, index: int, n: int, final_step: int | None = None) -> Managed:
    m = _start_managed(sweep, w, index, n)
    m.final_step = final_step
    if is_service(w):
        why = service_ready(sweep, m.copy, m.proc, MANAGED, 0)
        if why:
            raise BadInput(f"workloads.{index}.command", f"managed copy {n}: {why}")
    return m


# long: the sweep of one workload in order (reference, cycles on fresh copies, end, fidelity)
def sweep_workload(sweep: Sweep, w: Workload, index: int) -> WorkloadSweep:
    """One workload's reference run, cycles and fidelity; never raises for the workload's
    own failings (they are its result)."""
    out = WorkloadSweep(w.name, dt.datetime.now(dt.UTC))
    field_ = f"workloads.{index}"
    is_job = not is_service(w)
    m: Managed | None = None
    try:
        ref = (
            _reference_job(sweep, w, index, out) if is_job else _reference_service(sweep, w, index)
        )
        ref_log = sweep.cluster.log_path(sweep.slot, UNMANAGED, f"{w.name}-ref")
        query = w.fidelity is not None and w.fidelity.query is not None
        copies = 1
        m = _fresh(sweep, w, index, copies, out.final_step)
        for c in range(1, sweep.cycles + 1):
            moment = moment_of(c, is_job and w.app_checkpoint is not None)
            final = out.final_step or 0
            target = _target(w, c, sweep.cycles, final, moment) if is_job else None
            record = CycleRecord(c, moment, target)
            try:
                going = run_cycle(sweep, m, record, query)
            except _Ended as ended:
                if ended.unseen:
                    raise BadInput(f"{field_}.progress_probe.log_regex", str(ended)) from None
                if not out.cycles:
                    raise BadInput(
                        f"{field_}.command",
                        f"the workload exited before its first checkpoint: {ended}",
                    ) from None
                out.notes.append(str(ended))
                break
            out.cycles.append(record)
            if not going and c < sweep.cycles:
                m.close()
                sweep.cluster.stop_all()
                copies += 1
                out.notes.append(
                    f"cycle {c} did not restore: cycles {c + 1}.. on copy managed-{copies}"
                )
                m = _fresh(sweep, w, index, copies, out.final_step)
        if is_job and m is not None:
            if not sweep.cluster.wait_gone(m.proc, sweep.timeout_s):
                out.notes.append(f"the managed run did not end within {sweep.timeout_s:.0f} s")
            seen = m.probe.latest() if m.probe is not None else None  # all it logged
            last = seen.step if seen else None
            if last != out.final_step:
                out.notes.append(
                    f"the managed run ended at step {last}, the reference at {out.final_step}"
                )
        if m is not None:
            _fidelity(out, w, ref, ref_log, m)
    except CkptPocError as exc:  # BadInput names its field; others (a copy not starting) too
        out.error = (
            str(exc) if isinstance(exc, BadInput) else f"{field_}: {str(exc).splitlines()[0]}"
        )
    finally:
        if m is not None:
            m.close()
        sweep.cluster.stop_all()
    return out


@dataclass
class CompatibilityRun:
    sweeps: list[WorkloadSweep]
    run_dir: Path
    criu_version: str
    cycles: int


def run_compatibility(
    plan: Plan,
    ctx: RunContext,
    *,
    cycles: int | None = None,
    timeout_s: float | None = None,
    only: list[str] | None = None,
) -> CompatibilityRun:
    """Every workload (or those named in ``only``) through the plan's cycles, one after
    another on the plan's first slot."""
    from tasks.engine.checkpointers.criu import find_criu

    ensure_compatibility_runs(plan)
    if plan.cluster.kind != "local":
        raise CompatibilityRefused("run_compatibility sweeps on local slots: see run_sweep")
    find_criu()  # no CRIU: refused before any copy starts
    chosen = chosen_workloads(plan, only)
    cluster = process_slots(list(plan.cluster.nodes), run_folder(ctx), Path.cwd())
    recorder = EventRecorder(ctx)
    clean_dead_roots(*images_roots(plan, ctx))  # checkpoint folders killed runs left
    n = cycles or plan.compatibility.cycles
    sweep = Sweep(
        cluster,
        recorder,
        run_folder(ctx),
        plan.cluster.nodes[0],
        n,
        timeout_s or plan.compatibility.timeout_s,
        prepared_root(plan.data_dir, plan.poc),
        plan.checkpointer.images_dir,
        plan.checkpointer.gpu,
    )
    sweeps: list[WorkloadSweep] = []
    try:
        for index, w in chosen:
            cluster.workload = w.name  # the samplers' attribution
            sweeps.append(sweep_workload(sweep, w, index))
    finally:
        cluster.stop_all()
        cluster.close()
        recorder.flush()
    # The fingerprint read the version of the same binary (fingerprint.criu_binary).
    return CompatibilityRun(sweeps, run_folder(ctx), tool_version_of(ctx.fingerprint, "criu"), n)
