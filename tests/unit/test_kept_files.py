"""A program that keeps writing its own output file, dumped with `--leave-running` (what the
managed arm's periodic checkpoints do), then killed and restored with real CRIU.

CRIU refuses to restore once a file the tree held open has grown (`File … has bad size`,
range.md); the checkpoint keeps a copy of such files at the dump and puts it back before the
restore (tasks/engine/checkpointers/open_files.py). The second test takes the copy away and
shows CRIU's own refusal, so the first one cannot pass without it.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from unittest import mock

import pytest

from tasks.engine.checkpointers import open_files

pytestmark = pytest.mark.criu


def test_a_kept_file_whose_folder_is_gone_is_put_back_with_its_folder(tmp_path: Path) -> None:
    # Open MPI removes its session directory (ompi.*/pid.*/pmix_dstor_*/smlockseg-*) when
    # the ranks die, at times before the restore runs: CI saw "put back kept files: [Errno 2]".
    session = tmp_path / "ompi.vm.0" / "pid.2" / "pmix_dstor_ds21_2"
    session.mkdir(parents=True)
    segment = session / "smlockseg-1828454401"
    segment.write_bytes(b"lock state at the dump")
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / open_files.KEPT).mkdir()
    (checkpoint / open_files.KEPT / "0001").write_bytes(segment.read_bytes())
    manifest = {"files": [{"path": str(segment), "size": 22, "copy": "0001"}], "bytes": 22}
    (checkpoint / open_files.KEPT / open_files.MANIFEST).write_text(json.dumps(manifest))
    shutil.rmtree(tmp_path / "ompi.vm.0")
    assert open_files.put_back(checkpoint) == (1, 22)
    assert segment.read_bytes() == b"lock state at the dump"


def test_a_removed_kept_file_comes_back_with_its_mode_at_the_dump(tmp_path: Path) -> None:
    # CI saw CRIU refuse a restore of LAMMPS under mpirun: Open MPI's removed smdataseg,
    # recreated with the umask's 0644, "has bad mode 0100644 (expect 0100600)".
    segment = tmp_path / "smdataseg-1828454401-0"
    segment.write_bytes(b"data at the dump")
    os.chmod(segment, 0o600)
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    with mock.patch.object(open_files, "files_to_keep", return_value=[segment]):
        open_files.save(os.getpid(), checkpoint)
    segment.unlink()
    assert open_files.put_back(checkpoint) == (1, 16)
    assert stat.S_IMODE(segment.stat().st_mode) == 0o600
    assert segment.read_bytes() == b"data at the dump"
