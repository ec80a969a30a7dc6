"""The compatibility stage's checks on files, without CRIU (well under a second): fidelity
same / differs / not checked, bad input naming its field, CRIU's own cause read from its
log, the Wilson interval and the `--json` shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.data.plan import Fidelity
from tasks.engine.checkpointers.criu_failure import criu_failure_cause
from tasks.experiments.compatibility import WorkloadSweep
from tasks.experiments.compatibility_cycle import CycleRecord, moment_of
from tasks.experiments.compatibility_fidelity import BadInput, CopyFiles, compare_files
from tasks.experiments.compatibility_result import SWEEP_KEYS, wilson, workload_result

LOG = "start\nstep=1 loss=0.5\nstep=2 loss=0.25\neval accuracy=0.9722222222222222\ndone\n"


def _copy(root: Path, name: str, log: str = LOG, result: bytes = b"42\n") -> CopyFiles:
    folder = root / name
    folder.mkdir()
    (folder / "result.bin").write_bytes(result)
    (root / f"{name}.log").write_text(log)
    return CopyFiles(folder, root / f"{name}.log")


def _fidelity(**numbers: object) -> Fidelity:
    files: list[dict[str, object]] = [{"path": "{copy_dir}/result.bin"}]
    if numbers:
        files.append({"path": "{log}", "numbers": numbers})
    return Fidelity.model_validate({"files": files})


def test_an_undisturbed_copy_is_the_same(tmp_path: Path) -> None:
    ref, got = _copy(tmp_path, "ref"), _copy(tmp_path, "managed")
    verdict, files = compare_files(_fidelity(regex=r"loss=(?P<loss>\S+)$"), ref, got)
    assert verdict == "same"
    assert [f.verdict for f in files] == ["same", "same"]
    assert files[1].detail.startswith("2 numbers within")


def test_an_altered_file_differs(tmp_path: Path) -> None:
    ref, got = _copy(tmp_path, "ref"), _copy(tmp_path, "managed", result=b"43\n")
    verdict, files = compare_files(_fidelity(), ref, got)
    assert verdict == "differs"
    assert "sha256" in files[0].detail and "reference" in files[0].detail


def test_numbers_within_tolerance_are_the_same_and_beyond_it_differ(tmp_path: Path) -> None:
    ref = _copy(tmp_path, "ref")
    near = _copy(tmp_path, "near", LOG.replace("0.25", "0.2500000001"))
    far = _copy(tmp_path, "far", LOG.replace("0.25", "0.26"))
    short = _copy(tmp_path, "short", LOG.replace("step=2 loss=0.25\n", ""))
    exact = _fidelity(regex=r"loss=(\S+)$")
    loose = _fidelity(regex=r"loss=(\S+)$", rel_tol=1e-6)
    assert compare_files(exact, ref, near)[0] == "differs"
    assert compare_files(loose, ref, near)[0] == "same"
    verdict, files = compare_files(loose, ref, far)
    assert verdict == "differs" and "1 of 2 numbers differ" in files[1].detail
    assert "1 numbers, the reference has 2" in compare_files(loose, ref, short)[1][1].detail


def test_a_file_the_restored_run_never_wrote_differs(tmp_path: Path) -> None:
    ref, got = _copy(tmp_path, "ref"), _copy(tmp_path, "managed")
    (got.copy_dir / "result.bin").unlink()
    verdict, files = compare_files(_fidelity(), ref, got)
    assert verdict == "differs" and files[0].detail == "the restored run never wrote it"


def test_no_fidelity_is_not_checked(tmp_path: Path) -> None:
    ref, got = _copy(tmp_path, "ref"), _copy(tmp_path, "managed")
    assert compare_files(None, ref, got) == ("not checked", [])


def test_bad_input_names_the_field(tmp_path: Path) -> None:
    ref, got = _copy(tmp_path, "ref"), _copy(tmp_path, "managed")
    (ref.copy_dir / "result.bin").unlink()
    with pytest.raises(BadInput) as info:
        compare_files(_fidelity(), ref, got, "workloads.2.fidelity")
    assert info.value.field == "workloads.2.fidelity.files.0.path"
    assert "the reference run never wrote {copy_dir}/result.bin" in str(info.value)
    ref2, got2 = _copy(tmp_path, "ref2"), _copy(tmp_path, "managed2")
    with pytest.raises(BadInput) as info:
        compare_files(_fidelity(regex=r"^energy=(\S+)"), ref2, got2, "workloads.2.fidelity")
    assert info.value.field == "workloads.2.fidelity.files.1.numbers.regex"
    assert "matches nothing" in str(info.value)
    with pytest.raises(BadInput, match="no number"):
        compare_files(_fidelity(regex=r"^(start)"), ref2, got2, "workloads.2.fidelity")


# CRIU's own lines, as CRIU 4.2 writes them here (range.md).
DUMP_TCP = """\
(00.000800) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self
(00.004000) Dumping path for -3 fd via self 13 [/]
(00.019500) Error (criu/sk-inet.c:199): inet: Connected TCP socket, consider using \
--tcp-established option.
(00.019600) Error (criu/cr-dump.c:1669): Dump files (pid: 41) failed with -1
(00.021000) Error (criu/cr-dump.c:2093): Dumping FAILED.
"""
RESTORE_SIZE = """\
(00.000700) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self
(00.030000)      1: Error (criu/files-reg.c:2191): File tmp/x/md.log has bad size \
31156 (expect 26489)
(00.030100)      1: Error (criu/files.c:1215): Unable to open fd=3 id=0x6
(00.040000) Error (criu/cr-restore.c:2447): Restoring FAILED.
"""


def test_criu_s_cause_is_its_first_real_error_and_the_option_it_names(tmp_path: Path) -> None:
    log = tmp_path / "dump.log"
    log.write_text(DUMP_TCP)
    cause, wants = criu_failure_cause(log)
    assert cause == (
        "inet: Connected TCP socket, consider using --tcp-established option. (criu/sk-inet.c:199)"
    )
    assert wants == "--tcp-established"
    log.write_text(RESTORE_SIZE)
    cause, wants = criu_failure_cause(log)
    assert cause is not None and cause.startswith("File tmp/x/md.log has bad size 31156")
    assert wants is None
    log.write_text("(00.000800) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE\n")
    assert criu_failure_cause(log) == (None, None)  # the noise alone is no cause
    assert criu_failure_cause(tmp_path / "none.log") == (None, None)


def test_the_wilson_interval() -> None:
    assert wilson(0, 0) is None
    lo, hi = wilson(10, 10)  # type: ignore[misc]
    assert hi == 1.0 and lo == pytest.approx(0.7225, abs=1e-4)
    lo, hi = wilson(5, 10)  # type: ignore[misc]
    assert (lo, hi) == (pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4))
    lo, hi = wilson(0, 3)  # type: ignore[misc]
    assert lo == 0.0 and hi == pytest.approx(0.5615, abs=1e-4)


def test_moments_take_turns() -> None:
    assert [moment_of(c, True) for c in range(1, 6)] == [
        "app-checkpoint",
        "io",
        "periodic",
        "steady",
        "app-checkpoint",
    ]
    assert [moment_of(c, False) for c in range(1, 5)] == ["io", "periodic", "steady", "io"]


def test_a_workload_result_groups_causes_and_has_the_sweep_keys() -> None:
    import datetime as dt

    tcp = "inet: Connected TCP socket, consider using --tcp-established option. (x.c:1)"
    cycles = [
        CycleRecord(c, "io", dump="failed", cause=tcp, wants_option="--tcp-established", step=c)
        for c in (1, 2)
    ]
    cycles.append(
        CycleRecord(3, "steady", dump="ok", restore="ok", freeze_s=0.02, image_bytes=1000)
    )
    sweep = WorkloadSweep("tcp", dt.datetime.now(dt.UTC), cycles=cycles)
    result = workload_result(sweep)
    assert (result.cycles, result.restored) == (3, 1)
    assert result.success_rate == pytest.approx(1 / 3)
    (group,) = result.causes
    assert group.cycles == (1, 2) and "CRIU asks for --tcp-established" in group.cause
    assert [f.cycle for f in result.failures] == [1, 2]
    assert tuple(result.sweep_json()) == SWEEP_KEYS
    assert result.sweep_json()["ci"] == list(wilson(1, 3))  # type: ignore[arg-type]
    assert result.freeze_s_median == 0.02 and result.image_bytes_median == 1000
