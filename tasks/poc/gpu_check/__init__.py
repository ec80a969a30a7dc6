"""The GPU check (scripts/gpu-check): the product's GPU path measured on one bare GPU node,
with no Prefect, no Great Expectations and no pydantic (check.py)."""
