"""`python -m cli ARGS`: the same as `ckpt-poc ARGS`."""

from __future__ import annotations

from cli.app import app

if __name__ == "__main__":
    app()
