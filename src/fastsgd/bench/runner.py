"""`fastsgd bench SPEC.toml`: run a spec's cells on this machine, `jobs` at a time, each as
its own `fastsgd run|simulate` process writing its run directory under BENCH_DIR/cells/,
then report on them all (BENCH_DIR/report/). Cells already done are skipped, so a bench
that stopped goes on where it was; a cell that fails is named, with its error, and the
others go on."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from fastsgd import config as cfg
from fastsgd.bench.cluster import connect, run_cell_on_ray
from fastsgd.bench.spec import Cell, cells, load_spec
from fastsgd.errors import UserError
from fastsgd.metrics import write_json
from fastsgd.progress import Progress
from fastsgd.report import load_run, write_report
from fastsgd.report.runs import LABELS

MAX_CELLS = 64
ERROR_LINES = 5  # of a failed cell's stderr, in the bench's own output


def plan(spec: str | Path, out: str | Path | None, max_cells: int, yes: bool
         ) -> tuple[Path, list[Cell]]:
    mode, base, axes = load_spec(spec)
    matrix = cells(mode, base, axes)
    if len(matrix) > max_cells and not yes:
        raise UserError(f"{spec}: {len(matrix)} cells, more than --max-cells {max_cells}; "
                        "run them with --yes, or raise --max-cells")
    return Path(out) if out else Path("bench") / Path(spec).stem, matrix


def run_bench(spec: str | Path, out: str | Path | None = None, jobs: int = 1,
              max_cells: int = MAX_CELLS, yes: bool = False, quiet: bool = False,
              ray_address: str | None = None) -> int:
    """Run every cell not yet done, here (`jobs` at a time) or as tasks of the Ray cluster
    at `ray_address` (as many at a time as it schedules); returns how many failed."""
    root, matrix = plan(spec, out, max_cells, yes)
    ray = connect(ray_address) if ray_address else None
    (root / "cells").mkdir(parents=True, exist_ok=True)
    labels = root / "cells" / LABELS  # what each hashed folder is, for the report
    known = json.loads(labels.read_text()) if labels.is_file() else {}
    write_json(labels, {**known, **{c.id: c.label for c in matrix}})
    todo = [c for c in matrix if not done(root, c)]
    jobs = max(1, len(todo)) if ray else max(1, jobs)
    where = f"on the Ray cluster {ray_address}" if ray else f"{jobs} at a time"
    print(f"bench {spec}: {len(matrix)} cells, {len(matrix) - len(todo)} done before, "
          f"{len(todo)} to run, {where}, in {root}", file=sys.stderr)
    failed: list[Cell] = []
    finished = 0
    progress = Progress(len(todo), enabled=not quiet and bool(todo))
    # real cells time this machine: they run alone, after the simulated ones (here)
    alone = [] if ray else [c for c in todo if c.mode == "run"]
    for batch, width in (([c for c in todo if c not in alone], jobs), (alone, 1)):
        with ThreadPoolExecutor(max_workers=width) as pool:
            futures = {pool.submit(run_cell, root, c, ray): c for c in batch}
            for future in as_completed(futures):
                cell, error = futures[future], future.result()
                if error:
                    failed.append(cell)
                    print(f"\ncell {cell.id} ({cell.label}) failed: {error}", file=sys.stderr)
                finished += 1
                progress.show(finished, f"cell {cell.id} {'failed' if error else 'done'}")
    progress.close()
    complete = [cell_dir(root, c) for c in matrix if done(root, c)]
    if complete:
        written = write_report([load_run(d) for d in complete], root / "report",
                               title=f"fastsgd bench {Path(spec).name}")
        print(f"report: {', '.join(p.name for p in written)} in {root / 'report'}",
              file=sys.stderr)
    if failed:
        print(f"{len(failed)} of {len(matrix)} cells failed: {', '.join(c.id for c in failed)} "
              f"(their logs: {root / 'cells'}/ID.log)", file=sys.stderr)
    return len(failed)


def cell_dir(root: Path, cell: Cell) -> Path:
    return root / "cells" / cell.id


def done(root: Path, cell: Cell) -> bool:
    return (cell_dir(root, cell) / "summary.json").is_file()


def run_cell(root: Path, cell: Cell, ray: Any = None) -> str | None:
    """One cell as a process of its own, here or as a Ray task; None, or the last lines of
    its error."""
    folder = cell_dir(root, cell)
    folder.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if ray is not None:
        code, output = run_cell_on_ray(ray, folder, cell)
    else:
        spec = folder.parent / f"{cell.id}.toml"
        spec.write_text(cfg.to_toml(cell.config))
        proc = subprocess.run([sys.executable, "-m", "fastsgd", cell.mode, str(spec),
                               "--quiet", "--overwrite", "--set", f"run.out={folder}"],
                              capture_output=True, text=True)
        code, output = proc.returncode, proc.stdout + proc.stderr
    (folder.parent / f"{cell.id}.log").write_text(
        f"# {cell.label}, {time.perf_counter() - start:.1f} s, exit {code}\n{output}")
    if code == 0:
        return None
    lines = output.strip().splitlines()[-ERROR_LINES:]
    return "\n  ".join(lines) or f"exit code {code}"
