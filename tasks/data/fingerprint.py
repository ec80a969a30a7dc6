"""The run fingerprint: what this run ran on, captured once and stamped on every row.

Collected by small ``collect_<area>_metadata`` functions (after pyperf). GPU fields come from
NVML through nvidia-ml-py; without a GPU they are an explicit ``none``, never a guess.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import socket
import subprocess
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any, TypedDict, cast

from tasks.data import settings_bare

# The CRIU scripts/install-criu builds when the system's fails `criu check`.
CRIU_BUILD = Path(__file__).resolve().parents[2] / ".tools" / "criu" / "bin" / "criu"


class Fingerprint(TypedDict, total=False):
    """The fingerprint's columns, on every dataset's rows. total=False: a trials row carries
    its node's (read inside its Slurm job) or none until the run's is stamped on it."""

    fp_host: str
    fp_cpu_model: str
    fp_cores: int
    fp_mem_bytes: int
    fp_kernel: str
    fp_os: str
    fp_gpu_model: str
    fp_gpu_count: int
    fp_driver: str
    fp_cuda: str
    fp_versions: str  # JSON: package and tool → version


# Their names in order, declared once: by the TypedDict.
FINGERPRINT_COLUMNS: tuple[str, ...] = tuple(Fingerprint.__annotations__)

NONE = "none"
_PACKAGES = ("ckpt-poc", "prefect", "pandas", "pyarrow", "dask", "great-expectations")


def collect_host_metadata(md: dict[str, Any]) -> None:
    md["fp_host"] = socket.gethostname()
    md["fp_kernel"] = platform.release()
    md["fp_os"] = _os_release()
    md["fp_cores"] = os.cpu_count() or 0
    md["fp_cpu_model"] = _cpu_model()
    md["fp_mem_bytes"] = _mem_bytes()


def collect_gpu_metadata(md: dict[str, Any]) -> None:
    md.update(fp_gpu_model=NONE, fp_gpu_count=0, fp_driver=NONE, fp_cuda=NONE)
    try:
        import pynvml  # provided by nvidia-ml-py

        pynvml.nvmlInit()
    except Exception:  # no driver / library: this host has no usable GPU
        return
    try:
        count = pynvml.nvmlDeviceGetCount()
        models = sorted(
            {
                _text(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)))
                for i in range(count)
            }
        )
        cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        md.update(
            fp_gpu_model=",".join(models) or NONE,
            fp_gpu_count=count,
            fp_driver=_text(pynvml.nvmlSystemGetDriverVersion()),
            fp_cuda=f"{cuda // 1000}.{(cuda % 1000) // 10}",
        )
    finally:
        pynvml.nvmlShutdown()


def collect_versions_metadata(md: dict[str, Any]) -> None:
    versions: dict[str, str] = {"python": platform.python_version()}
    for pkg in _PACKAGES:
        try:
            versions[pkg] = importlib_metadata.version(pkg)
        except importlib_metadata.PackageNotFoundError:
            versions[pkg] = NONE
    versions["slurm"] = _tool_version(["sinfo", "--version"])
    criu = criu_binary()  # the one the checkpointer runs, which need not be on PATH
    versions["criu"] = _tool_version([criu, "--version"]) if criu else NONE
    md["fp_versions"] = json.dumps(versions, sort_keys=True)


def collect_fingerprint() -> Fingerprint:
    """This host's fingerprint, every column (a row's and an event's fields)."""
    md: dict[str, Any] = {}
    collect_host_metadata(md)
    collect_gpu_metadata(md)
    collect_versions_metadata(md)
    # In the columns' order: an event's detail and a row keep the order they are given.
    return cast(Fingerprint, {name: md[name] for name in FINGERPRINT_COLUMNS})


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _os_release() -> str:
    try:
        with open("/etc/os-release", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.platform()


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or NONE


def _mem_bytes() -> int:
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def criu_binary() -> str | None:
    """The CRIU the product runs: $CKPT_POC_CRIU, else the project's build, else PATH's."""
    for candidate in (settings_bare.criu(), str(CRIU_BUILD), shutil.which("criu")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def bare_version(text: str, kind: str) -> str:
    """'4.2.1' from a version line as the fingerprint keeps it ('Version: 4.2.1', 'criu
    version 4.2.1') or a bare one; '' when there is none."""
    text = re.sub(r"^(version:?\s*)", "", text.strip(), flags=re.IGNORECASE).strip()
    text = re.sub(rf"^{re.escape(kind)}\s+(version\s*)?", "", text, flags=re.IGNORECASE)
    return "" if text == NONE else text


def tool_version_of(fingerprint: Fingerprint, kind: str) -> str:
    """A tool's bare version from a run's fingerprint (``fp_versions``); 'unknown' without."""
    try:
        versions = json.loads(fingerprint.get("fp_versions") or "{}")
    except ValueError:
        versions = {}
    raw = versions.get(kind) if isinstance(versions, dict) else None
    return bare_version(str(raw), kind) if raw else "unknown"


def _tool_version(argv: list[str]) -> str:
    if shutil.which(argv[0]) is None:
        return NONE
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return NONE
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0] if text and out.returncode == 0 else NONE
