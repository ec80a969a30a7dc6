"""Checkpointers behind one protocol, keyed by the plan's checkpointer.kind (base.py): `criu`
(real here), `cedana` (its contract: install steps, requests, exit checklist), and `none`
(the unmanaged arm)."""
