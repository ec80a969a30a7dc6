"""What the PoC's install and checkpointer are known to put on a node before any install
record exists: the install's prefix and hook, the checkpointer's own files, and Cedana's
known leftovers. The exit diff adds what the install recorded (its `installed` events);
the writer recorder reads these globs to tell the install's executables and units."""

from __future__ import annotations

from tasks.data.plan import Plan
from tasks.exit.install import prefix_root

# What a checkpointer itself writes on a node, beyond what the install recorded: (kind, glob).
CHECKPOINTER_FOOTPRINT: dict[str, tuple[tuple[str, str], ...]] = {
    "criu": (
        ("files", "/run/criu.kdat"),  # CRIU's kernel-feature cache
        ("files", "/usr/lib/criu/*"),  # its plugins (CUDA, AMD)
        ("packages", "criu"),
        ("processes", "*/criu argv-*"),
        ("processes", "*/criu-ns argv-*"),
    ),
    "cedana": (),  # its known leftovers: tasks.engine.checkpointers.cedana_leftovers
}
# Footprint kinds whose globs name paths an executable or a unit can be at.
PATH_KINDS = ("files", "units")


def known_footprint(plan: Plan) -> list[tuple[str, str, str]]:
    """(kind, glob, why) of what the PoC's install and checkpointer put on a node."""
    root, poc = str(prefix_root()), plan.poc
    found = [
        ("files", root, "the install's prefix root"),
        ("files", f"{root}/{poc}", "the install's prefix"),
        ("files", f"{root}/{poc}/*", "under the install's prefix"),
        ("files", f"*/ckpt-poc-{poc}.conf", "the install's plugstack hook"),
        ("scheduler", f"file:*/ckpt-poc-{poc}.conf", "the install's plugstack hook"),
    ]
    kind = plan.checkpointer.kind
    for fkind, glob in CHECKPOINTER_FOOTPRINT.get(kind, ()):
        found.append((fkind, glob, f"the {kind} checkpointer's own footprint"))
    if kind == "cedana" and plan.cluster.kind in ("slurm", "kubernetes"):
        from tasks.engine.checkpointers.cedana_leftovers import expected_leftovers

        for left in expected_leftovers(plan.cluster.kind):
            why = f"Cedana's known leftover: {left['why']}"
            found.append((left["kind"], left["key_glob"], why))
    return found


def installed_globs(plan: Plan) -> list[str]:
    """The known footprint's path globs (an executable or unit there is the install's)."""
    return [glob for kind, glob, _ in known_footprint(plan) if kind in PATH_KINDS]
