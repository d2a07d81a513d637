"""`fastsgd bench`: a matrix of runs from a spec (spec.py), run on this machine (runner.py)
and reported together (fastsgd.report)."""

from fastsgd.bench.runner import run_bench
from fastsgd.bench.spec import Cell, cells, load_spec

__all__ = ["Cell", "cells", "load_spec", "run_bench"]
