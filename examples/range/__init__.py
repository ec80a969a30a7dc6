"""The range of applications' inputs (examples/range/README.md): real programs' input files
and the small generators they need; the programs themselves are Debian's and PyPI's."""
