"""Shipped example workloads: a small real training job and a small real inference server.

Both use scikit-learn's bundled 8x8 digits data set (no download) and a NumPy MLP, and are
written to be checkpointed and restored by CRIU: single-threaded, progress on stdout only,
no files held open while they change size. See ``examples/README.md``.
"""

import os
import sys

# One BLAS thread: the examples need no threads, a single-threaded process is the simplest
# thing for CRIU to dump, and the floating-point results cannot depend on a thread count.
# Only effective before NumPy is first imported (``python -m examples.…`` imports this
# package first); the caller's own settings win.
if "numpy" not in sys.modules:
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")
