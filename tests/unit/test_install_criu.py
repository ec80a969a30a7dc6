"""scripts/install-criu: finds or builds a working CRIU 4.x and prints its path, nothing else.

The first run on a machine builds CRIU from Debian testing's source package (about a
minute, most of it `make`); later runs use the cached build in .tools/criu. The build
fetches its source through a private apt state, so /etc/apt must be byte-identical
afterwards: the test hashes the whole tree before and after.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from tests.support.common import REPO

SCRIPT = REPO / "scripts" / "install-criu"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="criu check and the build need root")


def tree_digest(root: Path) -> str:
    """sha256 over every path under root: its type, mode, link target and file content."""
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted([*dirnames, *filenames]):
            path = Path(dirpath, name)
            st = path.lstat()
            digest.update(f"{path.relative_to(root)}\0{st.st_mode:o}\0".encode())
            if stat.S_ISLNK(st.st_mode):
                digest.update(os.readlink(path).encode())
            elif stat.S_ISREG(st.st_mode):
                digest.update(hashlib.sha256(path.read_bytes()).digest())
            digest.update(b"\n")
    return digest.hexdigest()


def run_install() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), "--print-path"],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )


@pytest.fixture(scope="module")
def install() -> tuple[subprocess.CompletedProcess[str], str, str]:
    before = tree_digest(Path("/etc/apt"))
    result = run_install()
    after = tree_digest(Path("/etc/apt"))
    return result, before, after


def criu_path(result: subprocess.CompletedProcess[str]) -> Path:
    assert result.returncode == 0, result.stderr[-4000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 1, f"stdout must be the path alone: {result.stdout!r}"
    return Path(lines[0])


def test_prints_an_executable_path(install) -> None:
    result, _, _ = install
    path = criu_path(result)
    assert path.is_absolute()
    assert path.is_file()
    assert os.access(path, os.X_OK)


def test_criu_is_version_4(install) -> None:
    path = criu_path(install[0])
    version = subprocess.run(
        [str(path), "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    assert re.search(r"^Version: 4\.\d+", version.stdout, re.MULTILINE), version.stdout


def test_criu_check_passes(install) -> None:
    path = criu_path(install[0])
    check = subprocess.run(
        [str(path), "check"], capture_output=True, text=True, timeout=120, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "Looks good" in check.stdout + check.stderr


def test_etc_apt_unchanged(install) -> None:
    _, before, after = install
    assert before == after, "/etc/apt changed while scripts/install-criu ran"


def test_second_run_is_cached_and_prints_the_same_path(install) -> None:
    first = criu_path(install[0])
    before = tree_digest(Path("/etc/apt"))
    again = run_install()
    assert criu_path(again) == first
    assert tree_digest(Path("/etc/apt")) == before
    assert "building" not in again.stderr
