"""Checkpointers, one interface: `criu` (real here), `none` (the unmanaged arm); `cedana` next."""
