"""Secrets from Prefect Secret blocks: a plan names the block, never holds the value."""

from __future__ import annotations

from tasks.data.errors import SecretError


def load_secret_block(block: str, purpose: str, instead: str = "") -> str:
    """The value of Prefect Secret block ``block``; SecretError naming it (never the value).

    ``purpose`` says what the secret is for, ``instead`` what else the user may do.
    """
    try:
        from prefect.blocks.system import Secret

        value = Secret.load(block).get()
    except Exception as exc:  # the block is absent or the API is unreachable
        # from None, and only the exception's type: its text may quote what was sent.
        raise SecretError(
            f"cannot load Prefect Secret block {block!r} for {purpose} "
            f"({type(exc).__name__}){'; ' + instead if instead else ''}"
        ) from None
    return str(value)
