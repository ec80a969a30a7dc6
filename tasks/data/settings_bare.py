"""The settings read where pydantic is not: the standard library's reading of three of them.

tasks/data/settings.py documents and reads every setting. Three are also read by processes
that must not import pydantic: the GPU check on a bare GPU node (its ML image's Python has
none), and a Slurm job's wrapper and job on their node, whose checkpointer is built after
`job_started`, in the managed arm's clock (pydantic's import would more than double the
job's start-up, on that arm alone). They read CKPT_POC_CRIU, CKPT_POC_KEEP_FILES_MAX and
CKPT_POC_LIBCUDA here; Settings parses the same three with the same functions, so both
readings agree. Nothing else reads the environment for configuration.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from tasks.data.env_markers import PREFIX
from tasks.data.errors import CkptPocError

DEFAULT_KEEP_FILES_MAX = 1 << 30  # 1 GiB, as open_files.DEFAULT_MAX_BYTES (stdlib alone there)
T = TypeVar("T")


class SettingsError(CkptPocError, ValueError):
    """A CKPT_POC_* variable holds a value its setting does not take (the message names it)."""


def env_name(field: str) -> str:
    """The variable that sets the setting ``field``: CKPT_POC_ and the name in capitals."""
    return PREFIX + field.upper()


def parse_criu(value: str | None) -> str | None:
    return value or None  # set but empty: as if unset


def parse_keep_files_max(value: str | int | None) -> int:
    if value is None:
        return DEFAULT_KEEP_FILES_MAX
    try:
        return int(value)
    except ValueError:
        raise ValueError("not a whole number of bytes") from None


def parse_libcuda(value: str | None) -> str:
    from tasks.data.gpu_capability import LIBCUDA  # ctypes and all: only where it is read

    return value or LIBCUDA


def _read(field: str, parse: Callable[[str | None], T]) -> T:
    name = env_name(field)
    value = os.environ.get(name)
    try:
        return parse(value)
    except ValueError as exc:
        raise SettingsError(f"{name}={value!r}: {exc}") from None


def criu() -> str | None:
    """The CRIU binary the operator names (CKPT_POC_CRIU); None when unset or empty."""
    return _read("criu", parse_criu)


def keep_files_max() -> int:
    """The largest file a leave-running dump keeps a copy of (CKPT_POC_KEEP_FILES_MAX)."""
    return _read("keep_files_max", parse_keep_files_max)


def libcuda() -> str:
    """The libcuda the GPU check loads (CKPT_POC_LIBCUDA), else the driver's by its soname."""
    return _read("libcuda", parse_libcuda)
