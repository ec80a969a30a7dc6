"""The sacct parser: every documented shape of a real dump, and never a crash on bad input."""

from __future__ import annotations

import io
import json

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tasks.baseline import accounting as acct
from tasks.baseline import fields, source_files
from tests.support.common import HEADER

PS = acct.Pseudonymiser(b"unit-test-key-0123456789")


def parse(text: str | bytes, **kw) -> tuple[pa.Table, list[acct.Quarantined], int]:
    data = text.encode() if isinstance(text, str) else text
    blocks = list(acct.parse_sacct_stream(io.BytesIO(data), "dump.psv", PS, **kw))
    tables = [b.jobs for b in blocks]
    jobs = pa.concat_tables(tables) if tables else None
    return jobs, [q for b in blocks for q in b.quarantine], sum(b.rows_read for b in blocks)


ROWS = [
    "100|100|c1|gpu|alice|proj|train|COMPLETED|0:0|2026-11-01T10:00:00|2026-11-01T10:00:05|"
    "2026-11-01T11:00:05|01:00:00|3600|1-00:00:00|1|8|"
    "billing=8,cpu=8,gres/gpu:a100=4,gres/gpu=4,mem=64G,node=1|n1",
    "100.batch|100.batch|c1||alice|proj|batch|COMPLETED|0:0|2026-11-01T10:00:05|"
    "2026-11-01T10:00:05|2026-11-01T11:00:05|01:00:00|3600||1|8|cpu=8,gres/gpu=4,mem=64G,node=1|n1",
    "101_3|105|c1|gpu|bob|proj|sweep|CANCELLED by 0|0:15|2026-11-01T10:00:00|"
    "2026-11-01T10:00:05|2026-11-01T10:30:05|00:30:00|1800|UNLIMITED|1|1|"
    "cpu=1,gres/gpu:v100=2,mem=4000M,node=1|n2",
    "102+0|102|c1|gpu|bob|proj|het|TIMEOUT|0:0|2026-11-01T10:00:00|Unknown|None|00:00:00|0|"
    "Partition_Limit|1|1|cpu=1|None assigned",
    "103_[9-11,13%25]|103|c1|gpu|bob|proj|arr|PENDING|0:0|2026-11-01T10:00:00|Unknown|Unknown|"
    "00:00:00|0|01:00:00|1|1||None assigned",
    "104|104|c1|gpu|carol|proj|long|NODE_FAIL|0:0|2026-01-01T00:00:00|2026-01-01T00:00:00|"
    "2027-03-28T06:00:24|451-06:00:24|38988024|UNLIMITED|2|16|cpu=16,gres/gpu=8,node=2|n[1-2]",
]


def test_every_documented_shape_parses() -> None:
    jobs, quarantine, read = parse(HEADER + "\n" + "\n".join(ROWS) + "\n")
    assert quarantine == []
    assert read == len(ROWS) == jobs.num_rows
    rows = {r["job_id"]: r for r in jobs.to_pylist()}
    assert rows["100"]["gpus"] == 4  # untyped entry, not typed + untyped
    assert rows["100"]["mem_bytes"] == 64 << 30
    assert rows["100"]["timelimit_s"] == 86400
    assert rows["100.batch"]["step"] == "batch" and not rows["100.batch"]["is_allocation"]
    assert rows["101_3"]["state"] == "CANCELLED" and rows["101_3"]["state_raw"] == "CANCELLED by 0"
    assert rows["101_3"]["gpus"] == 2  # typed only
    assert rows["101_3"]["array_job_id"] == "101" and rows["101_3"]["array_task_id"] == "3"
    assert rows["101_3"]["job_id_raw"] == "105"
    assert rows["101_3"]["exit_signal"] == 15 and rows["101_3"]["timelimit_s"] is None
    assert rows["102+0"]["het_job_id"] == "102" and rows["102+0"]["het_offset"] == 0
    assert rows["102+0"]["start"] is None and rows["102+0"]["end"] is None
    assert rows["102+0"]["timelimit_raw"] == "Partition_Limit"
    assert rows["103_[9-11,13%25]"]["array_task_id"] == "[9-11,13%25]"
    assert rows["104"]["elapsed_s"] == 38988024 and rows["104"]["nnodes"] == 2
    assert rows["100"]["source_line"] == 2 and rows["104"]["source_line"] == 7
    # Identities are pseudonymised before anything leaves the parser.
    assert all(r["user"].startswith("user-") and "alice" not in r["user"] for r in rows.values())


def test_header_less_dump_in_our_format() -> None:
    jobs, quarantine, _ = parse("\n".join(ROWS) + "\n")
    assert quarantine == [] and jobs.num_rows == len(ROWS)
    assert jobs.column("source_line").to_pylist()[0] == 1


def test_parsable_trailing_delimiter_and_other_delimiter() -> None:
    text = HEADER + "|\n" + "\n".join(r + "|" for r in ROWS) + "\n"
    jobs, quarantine, _ = parse(text)
    assert quarantine == [] and jobs.num_rows == len(ROWS)
    caret = (HEADER + "\n" + "\n".join(ROWS)).replace("|", "^|^")
    jobs2, q2, _ = parse(caret + "\n")
    assert q2 == [] and jobs2.column("gpus").to_pylist() == jobs.column("gpus").to_pylist()


def test_header_in_another_order_with_missing_optional_fields() -> None:
    header = "State|JobID|User|Account|JobName|Submit|Start|End|Elapsed|AllocTRES"
    row = (
        "FAILED|7|u|a|n|2026-11-01T00:00:00|2026-11-01T00:00:00|2026-11-01T02:00:00|"
        "02:00:00|gres/gpu=2"
    )
    jobs, quarantine, _ = parse(f"{header}\n{row}\n")
    r = jobs.to_pylist()[0]
    assert quarantine == [] and r["state"] == "FAILED" and r["elapsed_s"] == 7200 and r["gpus"] == 2


def test_bad_rows_are_quarantined_with_reason_and_line() -> None:
    bad = [
        ROWS[0] + "|extra",  # one field too many (a short row reads as empty fields)
        ROWS[0].replace("COMPLETED", "exploded!"),
        ROWS[0].replace("2026-11-01T10:00:00", "yesterday"),
        ROWS[0].replace("|3600|", "|12x|"),
        ROWS[0].replace("0:0", "zero"),
        ROWS[0].replace("1-00:00:00", "forever"),
        ROWS[0].replace("100|100", "abc|abc"),
    ]
    text = HEADER + "\n" + ROWS[0] + "\n\n" + "\n".join(bad) + "\n"
    jobs, quarantine, read = parse(text)
    assert jobs.num_rows == 1
    assert read == jobs.num_rows + len(quarantine) == 1 + len(bad)
    reasons = {q.source_line: q.reason for q in quarantine}
    assert reasons[4] == "20 fields, expected 19"  # line 3 is the blank line
    assert "State is empty or not a state name" in reasons[5]
    assert "Submit is not a timestamp" in reasons[6]
    assert "ElapsedRaw" in reasons[7]
    assert "ExitCode" in reasons[8]
    assert "Timelimit" in reasons[9]
    assert "JobID" in reasons[10]
    assert all("alice" not in q.raw and "proj" not in q.raw for q in quarantine)


def test_invalid_utf8_job_name_is_quarantined_not_crashing() -> None:
    data = (
        (HEADER + "\n" + ROWS[0] + "\n").encode()
        + ROWS[0].replace("train", "tr\xffain").encode("latin-1")
        + b"\n"
    )
    jobs, quarantine, read = parse(data)
    assert jobs.num_rows == 1 and len(quarantine) == 1 and read == 2
    assert "UTF-8" in quarantine[0].reason


def test_utf8_job_names_survive() -> None:
    jobs, quarantine, _ = parse(HEADER + "\n" + ROWS[0].replace("train", "трен-訓練") + "\n")
    assert quarantine == [] and jobs.column("job_name").to_pylist() == ["трен-訓練"]


def test_header_lacking_required_fields_is_a_clear_error() -> None:
    import pytest

    from tasks.data.errors import AccountingError

    with pytest.raises(AccountingError, match=r"dump.psv:1: the header lacks JobID"):
        parse("State|Submit\nCOMPLETED|2026-01-01T00:00:00\n")
    with pytest.raises(AccountingError, match=r"no header line, and the first row has 3 fields"):
        parse("1|COMPLETED|x\n")


def test_blocks_boundaries_do_not_change_the_result() -> None:
    text = HEADER + "\n" + "\n".join(ROWS * 50) + "\nbroken\n" + "\n".join(ROWS * 50) + "\n"
    whole, q1, r1 = parse(text)
    small, q2, r2 = parse(text, block_bytes=1000)
    assert whole.num_rows == small.num_rows and r1 == r2
    assert whole.column("source_line").to_pylist() == small.column("source_line").to_pylist()
    assert [q.source_line for q in q1] == [q.source_line for q in q2] == [302]


def test_blocks_parsed_side_by_side_come_out_in_input_order(monkeypatch) -> None:
    """Blocks parsed three at a time give the rows, lines and quarantine of one at a time."""
    text = HEADER + "\n" + "\n".join(ROWS * 50) + "\nbroken\n" + "\n".join(ROWS * 50) + "\n"
    monkeypatch.setattr(acct, "PARSE_THREADS", 1)
    alone, q1, r1 = parse(text, block_bytes=700)
    monkeypatch.setattr(acct, "PARSE_THREADS", 3)
    side, q2, r2 = parse(text, block_bytes=700)
    assert side.equals(alone) and r1 == r2
    assert [(q.source_line, q.reason) for q in q2] == [(q.source_line, q.reason) for q in q1]


def test_tres_gpu_counting() -> None:
    assert fields.parse_tres("gres/gpu:a100=4,gres/gpu=4").gpus == 4
    assert fields.parse_tres("gres/gpu:a100=2,gres/gpu:v100=1").gpus == 3
    assert fields.parse_tres("cpu=4,mem=1Gn,node=1").mem == 1 << 30
    assert fields.parse_tres("garbage").bad


def test_parsed_values_are_their_struct_types_rows() -> None:
    """Arrow builds each struct column from the parsers' tuples, field by field in order."""
    for row, struct in (
        (fields.TimeLimit, fields.TIMELIMIT_TYPE),
        (fields.Tres, fields.TRES_TYPE),
        (fields.Gres, fields.GRES_TYPE),
        (fields.ParsedState, fields.STATE_TYPE),
        (fields.ExitCode, fields.EXIT_TYPE),
    ):
        assert row._fields == tuple(f.name for f in struct), row


def test_pseudonyms_are_keyed() -> None:
    other = acct.Pseudonymiser(b"another-key-0123456789")
    assert PS.token("user", b"alice") != other.token("user", b"alice")
    assert PS.token("user", b"alice") == PS.token("user", b"alice")
    assert "key" not in repr(PS).replace("<key hidden>", "")


def test_sacct_json_becomes_the_same_rows() -> None:
    doc = {
        "jobs": [
            {
                "job_id": 42,
                "name": "train",
                "user": "alice",
                "account": "proj",
                "cluster": "c1",
                "partition": "gpu",
                "nodes": "n1",
                "state": {"current": "FAILED", "reason": "None"},
                "exit_code": {"status": "FAILED", "return_code": 3},
                "time": {
                    "submission": 1767225600,
                    "start": 1767225605,
                    "end": 1767229205,
                    "elapsed": 3600,
                    "limit": 60,
                },
                "tres": {
                    "allocated": [
                        {"type": "cpu", "name": "", "count": 2},
                        {"type": "gres", "name": "gpu", "count": 2},
                        {"type": "node", "name": "", "count": 1},
                    ]
                },
                "allocation_nodes": 1,
                "array": {"job_id": 0, "task_id": None},
                "het": {"job_id": 0, "job_offset": None},
            }
        ]
    }
    psv = source_files.sacct_json_to_psv(json.dumps(doc).encode(), "x.json")
    jobs, quarantine, _ = parse(psv)
    r = jobs.to_pylist()[0]
    assert quarantine == []
    assert (r["job_id"], r["state"], r["gpus"], r["elapsed_s"], r["timelimit_s"]) == (
        "42",
        "FAILED",
        2,
        3600,
        3600,
    )


def test_a_carriage_return_inside_a_field_reads_as_a_space() -> None:
    """sacct prints a job name's carriage return as it is (and a JSON name may hold one):
    the row stays one row, its neighbours untouched, in a -P dump and a --json document."""
    named = ROWS[0].replace("|train|", "|tr\rain|")
    for line_end in ("\n", "\r\n"):
        text = line_end.join([HEADER, named, ROWS[2], ""])
        jobs, quarantine, read = parse(text)
        assert quarantine == [] and read == 2 == jobs.num_rows
        assert jobs.column("job_name").to_pylist() == ["tr ain", "sweep"]
    doc = {"jobs": [{"job_id": 7, "name": "a\rb", "state": {"current": "COMPLETED"}}]}
    jobs, quarantine, read = parse(source_files.sacct_json_to_psv(json.dumps(doc).encode(), "x"))
    assert read == 1 == jobs.num_rows and jobs.column("job_name").to_pylist() == ["a b"]


# Any character but a newline: a carriage return inside a field is sacct's to print.
FIELD = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=12
)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    rows=st.lists(
        st.one_of(
            st.lists(FIELD, min_size=0, max_size=22).map(lambda fs: "|".join(fs)),
            st.sampled_from(ROWS),
            st.sampled_from(ROWS).map(lambda r: r[: len(r) // 2]),
        ),
        min_size=1,
        max_size=30,
    ),
    header=st.booleans(),
)
def test_parser_never_crashes_and_counts_reconcile(rows: list[str], header: bool) -> None:
    from tasks.data.errors import AccountingError

    text = ((HEADER + "\n") if header else "") + "\n".join(rows) + "\n"
    try:
        jobs, quarantine, read = parse(text)
    except AccountingError:
        # Only an unusable first line may refuse the whole input, and only without a header.
        assert not header
        return
    non_empty = sum(1 for r in rows if r.strip("\r"))
    parsed = jobs.num_rows if jobs is not None else 0
    assert read == parsed + len(quarantine)
    assert all(q.reason for q in quarantine)
    assert read <= non_empty + 1


_BLOCK_INPUTS = [
    b"",
    b"a|b\n",
    b"a|b\nc|d",  # the last line without its newline
    b"h\n" + b"x" * 5000 + b"\nshort\n\n\nlast",  # a line longer than a block, empty lines
    b"".join(b"%d|%s\n" % (i, b"y" * (i % 37)) for i in range(3000)),
]


def _blocks_of(stream: io.BufferedIOBase, start: int, block_bytes: int) -> list[tuple]:
    stream.seek(start)
    views = list(acct.iter_blocks(stream, block_bytes))
    # Read only now: a mapped block given back by then must read the same again.
    return [(bytes(view), line, newlines) for view, line, newlines in views]


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.sampled_from(_BLOCK_INPUTS),
    block_bytes=st.sampled_from([1, 7, 64, 4096, 1 << 20]),
    start=st.integers(0, 3),
)
def test_blocks_are_the_same_from_a_mapped_file_a_bytesio_and_a_pipe(
    tmp_path_factory, data: bytes, block_bytes: int, start: int
) -> None:
    """A regular file is read as mapped pages and a BytesIO from its value, anything else by
    reads: every way gives the same newline-aligned blocks, line numbers and newline counts,
    from the stream's position on."""
    start = min(start, len(data))
    path = tmp_path_factory.mktemp("blocks") / "dump.psv"
    path.write_bytes(data)
    with open(path, "rb") as mapped:
        from_file = _blocks_of(mapped, start, block_bytes)
    from_bytesio = _blocks_of(io.BytesIO(data), start, block_bytes)
    reader = io.BufferedReader(io.BytesIO(data))  # not a file: read as a stream
    from_reads = _blocks_of(reader, start, block_bytes)
    assert from_file == from_bytesio == from_reads
    assert b"".join(block for block, _, _ in from_reads) == data[start:]
    for block, _, _ in from_reads[:-1]:
        assert block.endswith(b"\n")
