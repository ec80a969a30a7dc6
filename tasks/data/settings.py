"""The product's configuration: every CKPT_POC_* variable an operator sets, in one place.

Each setting is a field of `Settings`, read from the variable CKPT_POC_<FIELD> (in capitals),
typed, with its default and what it does. `settings()` reads the environment anew at every
call (nothing is cached: a test's monkeypatched variable counts at once); a variable set to
a value its setting does not take is a SettingsError naming it. Secrets are SecretStr.

Not here: the variables the PoC hands to the processes it starts (tasks/data/env_markers.py),
and those only the scripts read (scripts/prefect-up's CKPT_POC_PREFECT_*, scripts/gpu-check's
CKPT_POC_PYTHON). Where pydantic is not (the GPU check, a Slurm job on its node), three
settings are read by tasks/data/settings_bare.py, with the parsing their fields here use.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from tasks.data.env_markers import PREFIX
from tasks.data.gpu_capability import LIBCUDA
from tasks.data.settings_bare import (
    DEFAULT_KEEP_FILES_MAX,
    SettingsError,
    env_name,
    parse_criu,
    parse_keep_files_max,
    parse_libcuda,
)

__all__ = ["Settings", "SettingsError", "env_name", "settings"]

log = logging.getLogger(__name__)

# Set but empty: as if unset (the field's default), as these were always read.
_EMPTY_IS_UNSET = (
    "pseudonym_key",
    "prefix_root",
    "lock_dir",
    "prefect_start_timeout_s",
    "cedana_token_block",
    "cedana_controller",
)
_SECRET = frozenset({"pseudonym_key"})  # never shown, not even in an error
_warned: set[tuple[str, str]] = set()


class Settings(BaseSettings):
    """What configures the product, each field set by CKPT_POC_<FIELD>."""

    model_config = SettingsConfigDict(env_prefix=PREFIX)

    # --- CRIU and the GPU ---------------------------------------------------------------------
    criu: str | None = Field(
        None,
        description="The CRIU binary the checkpointer runs and the fingerprint names. Unset: "
        "the project's build (.tools/criu, from scripts/install-criu), else `criu` on PATH. "
        "A managed-job wrapper sets it to its install prefix's bin/criu.",
    )
    keep_files_max: int = Field(
        DEFAULT_KEEP_FILES_MAX,
        description="Bytes: the largest file a --leave-running dump keeps a copy of beside "
        "CRIU's images (tasks/engine/checkpointers/open_files.py), so that the copy left "
        "running restores; a larger one is not copied, and the kept files' manifest says so.",
    )
    libcuda: str = Field(
        LIBCUDA,
        description="The libcuda the GPU check (scripts/gpu-check) loads for its capability "
        "check and the checkpoint toggle (its --libcuda overrides it; the contract test gives "
        "its stand-in). Default: the driver's, by its soname.",
    )
    # --- baseline ------------------------------------------------------------------------------
    pseudonym_key: SecretStr | None = Field(
        None,
        description="The HMAC key (16 bytes or more) users, accounts, job names and process "
        "argvs are pseudonymised with. Unset: the Prefect Secret block the plan names in "
        "baseline.pseudonym_key_secret (`ckpt-poc demo` makes a one-off key when neither is).",
    )
    json_workers: int | None = Field(
        None,
        description="Processes converting a `sacct --json` file, this one included (at most 8; "
        "1: one process, always). Unset: one per usable CPU for a file of {64 * _MIB >> 20} "
        "MiB or more, else one. Not a number: 1, with a warning.",
    )
    parse_threads: int | None = Field(
        None,
        description="sacct text blocks parsed at once (1: one at a time). Unset: 2, or 1 on "
        "one CPU. Not a number: 1, with a warning. Read when tasks.baseline.accounting is "
        "imported.",
    )
    dask_threshold_bytes: int = Field(
        2 << 30,
        description="Bytes: an accounting input larger than this is parsed with Dask, a "
        "smaller one in this process (2 GiB).",
    )
    # --- data gates ----------------------------------------------------------------------------
    gx_worker: bool | None = Field(
        None,
        description="Whether the data gates run Great Expectations in a worker process started "
        "ahead, its import overlapping the parse: 0 never, any other value always. Unset: "
        "with 4 usable CPUs or more, or for an input of 64 MiB or more.",
    )
    gx_max_rows: int = Field(
        20_000,
        description="Rows Great Expectations validates per dataset: a larger table is validated "
        "on a seeded random sample of this many rows, and checked exactly over every row with "
        "pyarrow. Read when tasks.data.gates is imported.",
    )
    # --- install, locks, the Prefect server ---------------------------------------------------
    prefix_root: Path = Field(
        Path("/opt/ckpt-poc"),
        description="Where install puts a PoC on each Slurm node: <root>/<poc>/ holds bin/criu, "
        "the managed-job wrapper, the SPANK plugin and the install manifest.",
    )
    lock_dir: Path = Field(
        Path("/tmp/ckpt-poc-locks"),
        description="The folder of the node locks (one flock'ed file per node) that keep two "
        "experiments on this host off the same node.",
    )
    prefect_start_timeout_s: float = Field(
        180.0,
        description="Seconds a command waits for the Prefect server it starts to answer.",
    )
    # --- Cedana ----------------------------------------------------------------------------------
    cedana_token_block: str | None = Field(
        None,
        description="The Prefect Secret block holding Cedana's bearer token, read when "
        "CEDANA_AUTH_TOKEN is unset.",
    )
    cedana_controller: str | None = Field(
        None,
        description="A plan node that also runs slurmctld: Cedana's controller step runs there. "
        "Unset: the slurmctld side is the site's precondition.",
    )

    @field_validator(*_EMPTY_IS_UNSET, mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any, info: ValidationInfo) -> Any:
        return cls.model_fields[info.field_name or ""].default if value == "" else value

    @field_validator("criu", mode="before")
    @classmethod
    def _criu(cls, value: Any) -> Any:
        return parse_criu(value)

    @field_validator("keep_files_max", mode="before")
    @classmethod
    def _keep_files_max(cls, value: Any) -> Any:
        return parse_keep_files_max(value)

    @field_validator("libcuda", mode="before")
    @classmethod
    def _libcuda(cls, value: Any) -> Any:
        return parse_libcuda(value)

    @field_validator("json_workers", "parse_threads", mode="before")
    @classmethod
    def _count(cls, value: Any, info: ValidationInfo) -> Any:
        """A count (at least 1); None when unset or blank. Not a number: 1, said once."""
        if value is None:
            return None
        text = str(value).strip()
        if not text:
            return None
        try:
            return max(1, int(text))
        except ValueError:
            name = env_name(info.field_name or "")
            if (name, text) not in _warned:
                _warned.add((name, text))
                log.warning("%s=%r is not a number; using 1", name, value)
            return 1

    @field_validator("gx_worker", mode="before")
    @classmethod
    def _zero_is_off(cls, value: Any) -> Any:
        return value != "0" if isinstance(value, str) else value


class _Given(Settings):
    """Settings from a given mapping alone, never the process's environment."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def settings(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings as the environment holds them now, or as ``environ`` does (a caller's
    mapping, read instead of the process's environment). SettingsError names each variable
    set to a value its setting does not take."""
    try:
        if environ is None:
            return Settings()
        given = {
            field: environ[env_name(field)]
            for field in Settings.model_fields
            if env_name(field) in environ
        }
        return _Given(**given)
    except ValidationError as exc:
        raise SettingsError(_said(exc)) from None


def _said(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else ""
        shown = "<hidden>" if field in _SECRET else repr(error["input"])
        reason = error["msg"].removeprefix("Value error, ")
        lines.append(f"{env_name(field)}={shown}: {reason}")
    return "\n".join(lines)
