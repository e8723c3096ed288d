"""The pieces of `scripts/bench.py`: one measurement a module, plus the report they fill in.

Nothing here asserts a figure: each target is printed PASS or FAIL beside the figure it judges.
"""
