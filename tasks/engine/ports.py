"""A free TCP port for a copy that serves (light: the GPU check imports it on a bare node)."""

from __future__ import annotations

import contextlib
import socket


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's pick; a copy binds it soon after)."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
