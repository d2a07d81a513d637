"""Reports of run directories, read from the run-directory contract only (DESIGN.md §1):
the few lines a run prints (text.py), and tables, plots and one HTML page over any number
of runs (`fastsgd report`: runs.py reads them, table.py, markdown.py, plots.py and page.py
write, with notes.py's lines where runs cannot be compared as they stand)."""

from fastsgd.report.page import write_report, write_run_report
from fastsgd.report.runs import RunData, find_runs, load_run
from fastsgd.report.text import human_bytes, phase_breakdown, plural, text_report

__all__ = ["RunData", "find_runs", "human_bytes", "load_run", "phase_breakdown", "plural",
           "text_report", "write_report", "write_run_report"]
