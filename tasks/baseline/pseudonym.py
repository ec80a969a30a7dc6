"""Pseudonymisation: identities (user, account, job name) as keyed HMAC-SHA256 tokens.

The key comes from the environment (KEY_ENV) or a Prefect Secret block and never leaves the
Pseudonymiser: no repr, no log, no row of any dataset.
"""

from __future__ import annotations

import hashlib
import hmac

import pyarrow as pa
import pyarrow.compute as pc

from tasks.data.errors import SecretError
from tasks.data.secret_blocks import load_secret_block
from tasks.data.settings import env_name, settings

KEY_ENV = env_name("pseudonym_key")


class Pseudonymiser:
    """Keyed HMAC-SHA256 of identities; the key never leaves this object (no repr, no log)."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise SecretError("the pseudonymisation key must be at least 16 bytes")
        self._key = key

    def __repr__(self) -> str:
        return "Pseudonymiser(<key hidden>)"

    def token(self, prefix: str, value: str | bytes) -> str:
        data = value.encode() if isinstance(value, str) else value
        digest = hmac.new(self._key, prefix.encode() + b"\0" + data, hashlib.sha256)
        return f"{prefix}-{digest.hexdigest()[:16]}"

    def column(self, prefix: str, values: pa.Array) -> pa.Array:
        """Pseudonymise a column, hashing each distinct value once (dictionary-encoded out)."""
        encoded = values if pa.types.is_dictionary(values.type) else pc.dictionary_encode(values)
        distinct = encoded.dictionary.to_pylist()
        tokens = [self.token(prefix, v or b"") for v in distinct]
        indices = encoded.indices
        if indices.null_count:  # a missing identity is pseudonymised as the empty one
            tokens.append(self.token(prefix, b""))
            indices = pc.fill_null(indices, len(tokens) - 1)
        return pa.DictionaryArray.from_arrays(indices, pa.array(tokens, pa.string()))


def load_pseudonym_key(secret_block: str | None = None) -> tuple[bytes, str]:
    """The HMAC key from the environment, else from a Prefect Secret; (key, where it came from)."""
    value = settings().pseudonym_key
    if value is not None:
        return value.get_secret_value().encode(), f"environment variable {KEY_ENV}"
    if secret_block:
        secret = load_secret_block(
            secret_block, "the pseudonymisation key", f"set {KEY_ENV} instead"
        )
        return secret.encode(), f"Prefect Secret {secret_block!r}"
    raise SecretError(
        f"no pseudonymisation key: set {KEY_ENV} or name a Prefect Secret block in "
        "baseline.pseudonym_key_secret"
    )
