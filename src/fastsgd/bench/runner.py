"""`fastsgd bench SPEC.toml`: run a spec's cells on this machine, `jobs` at a time, each as
its own `fastsgd run|simulate` process writing its run directory under BENCH_DIR/cells/,
then report on them all (BENCH_DIR/report/: each cell's time to its run's target,
run.target_loss where set, else run.target_accuracy, scored over seeds as MLPerf does).
Cells already done are skipped, so a bench that stopped goes on where it was; a cell that
fails is named, with its error, and the others go on. Cells of one workload that profile
their compute are charged one profile (profiles.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from fastsgd.bench.cluster import connect, run_cell_on_ray
from fastsgd.bench.netns import Refused, check_can_emulate
from fastsgd.bench.profiles import Profiles, with_times
from fastsgd.bench.spec import Cell, cells, command, load_spec
from fastsgd.config import schema as cfg
from fastsgd.errors import Interrupted, UserError
from fastsgd.records.metrics import write_json
from fastsgd.records.progress import Progress
from fastsgd.records.rundir import holds_run
from fastsgd.report import load_run, write_report
from fastsgd.report.runs import LABELS

MAX_CELLS = 64
ERROR_LINES = 5  # of a failed cell's stderr, in the bench's own output
ERROR, TRACEBACK = "fastsgd: error:", "Traceback (most recent call last):"  # in it: `told`


def plan(spec: str | Path, out: str | Path | None, max_cells: int, yes: bool
         ) -> tuple[Path, list[Cell]]:
    mode, base, axes = load_spec(spec)
    matrix = cells(mode, base, axes)
    if len(matrix) > max_cells and not yes:
        raise UserError(f"{spec}: {len(matrix)} cells, more than --max-cells {max_cells}; "
                        "run them with --yes, or raise --max-cells")
    return Path(out) if out else Path("bench") / Path(spec).stem, matrix


def _cells(n: int) -> str:
    return f"{n} cell" if n == 1 else f"{n} cells"


def run_bench(spec: str | Path, out: str | Path | None = None, jobs: int = 1,
              max_cells: int = MAX_CELLS, yes: bool = False, quiet: bool = False,
              ray_address: str | None = None) -> int:
    """Run every cell not yet done, here (`jobs` at a time) or as tasks of the Ray cluster
    at `ray_address` (as many at a time as it schedules); returns how many failed."""
    for flag, value in (("--jobs", jobs), ("--max-cells", max_cells)):
        if value < 1:
            raise UserError(f"{flag} {value}: it must be 1 or more")
    root, matrix = plan(spec, out, max_cells, yes)
    if holds_run(root):
        raise UserError(f"--out {root}: that folder holds a run (its config.toml, metrics...); "
                        "a bench needs a folder of its own")
    ray = connect(ray_address) if ray_address else None
    if ray is None and any(c.mode == "hosts" and not done(root, c) for c in matrix):
        try:  # before any cell runs: this machine must be able to make namespaces
            check_can_emulate(f"fsgd{os.getpid()}")
        except (Refused, subprocess.SubprocessError) as e:
            raise UserError(f"{spec}: mode 'hosts' cells cannot run here: {e}") from None
    _make(root / "cells")
    labels = root / "cells" / LABELS  # what each hashed folder is, for the report
    known = json.loads(labels.read_text()) if labels.is_file() else {}
    write_json(labels, {**known, **{c.id: c.label for c in matrix}})
    todo = [c for c in matrix if not done(root, c)]
    jobs = max(1, len(todo)) if ray else max(1, min(jobs, len(todo)))
    where = f"on the Ray cluster {ray_address}" if ray else f"{jobs} at a time"
    print(f"bench {spec}: {_cells(len(matrix))}, {len(matrix) - len(todo)} done before, "
          f"{len(todo)} to run, {where}, in {root}", file=sys.stderr)
    profiles = Profiles(matrix, lambda c: cell_dir(root, c), lambda c: done(root, c))
    try:
        failed = _run_all(root, _waves(todo, jobs, ray, profiles), ray, quiet, profiles)
    except KeyboardInterrupt:
        _stop_cells()
        finished = sum(done(root, c) for c in matrix)
        raise Interrupted(f"bench interrupted: {finished} of {len(matrix)} cells done; the "
                          "same command goes on with the others") from None
    complete = [cell_dir(root, c) for c in matrix if done(root, c)]
    if complete:
        written = write_report([load_run(d) for d in complete], root / "report",
                               title=f"fastsgd bench {Path(spec).name}")
        print((root / "report" / "report.md").read_text().rstrip())  # the tables, here too
        print(f"report: {', '.join(p.name for p in written)} in {root / 'report'}",
              file=sys.stderr)
    if failed:
        print(f"{len(failed)} of {len(matrix)} cells failed: {', '.join(c.id for c in failed)} "
              f"(their logs: {root / 'cells'}/ID.log)", file=sys.stderr)
    return len(failed)


def _make(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # --out names a file, say
        raise UserError(f"bench folder {folder.parent}: cannot make {folder} "
                        f"({e.strerror})") from None


def timed(cell: Cell) -> bool:
    """A cell whose results depend on this machine's speed: real processes, or a simulation
    that measures compute (profile, measured). Here, they run alone."""
    return cell.mode != "simulate" or cell.config["compute"]["model"] != "fixed"


def _waves(todo: list[Cell], jobs: int, ray: Any, profiles: Profiles
           ) -> list[tuple[list[Cell], int]]:
    """The cells to run, in waves, each with how many run at a time: here, those whose
    results depend on this machine's speed after the others, one at a time; on Ray, all at
    once. Last, the cells given another cell's profile (profiles.py), once it is done."""
    later = {c.id for c in profiles.given(todo)}
    alone = [] if ray else [c for c in todo if timed(c) and c.id not in later]
    first = [c for c in todo if c.id not in later | {a.id for a in alone}]
    return [(first, jobs), (alone, 1),
            ([c for c in todo if c.id in later], jobs if ray else 1)]


def _run_all(root: Path, waves: list[tuple[list[Cell], int]], ray: Any, quiet: bool,
             profiles: Profiles) -> list[Cell]:
    failed: list[Cell] = []
    finished = 0
    total = sum(len(batch) for batch, _ in waves)
    progress = Progress(total, enabled=not quiet and total > 0)
    for batch, width in waves:
        if not batch:
            continue
        pool = ThreadPoolExecutor(max_workers=width)
        try:  # a cell's times are looked up as it starts: those before it are done
            futures = {pool.submit(_start, root, c, ray, profiles): c for c in batch}
            for future in as_completed(futures):
                cell, error = futures[future], future.result()
                if error:
                    failed.append(cell)
                    print(f"\ncell {cell.id} ({cell.label}) failed: {error}", file=sys.stderr)
                finished += 1
                progress.show(finished, f"cell {cell.id} {'failed' if error else 'done'}")
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # Ctrl-C: queued cells never start
    progress.close()
    return failed


def _start(root: Path, cell: Cell, ray: Any, profiles: Profiles) -> str | None:
    return run_cell(root, cell, ray, profiles.times(cell))


_running: dict[subprocess.Popen, str] = {}  # the cells' processes and modes, for Ctrl-C
_lock = threading.Lock()
STOP_WITHIN = {"hosts": 60.0}  # a hosts cell deletes its namespaces first; others: 10 s


def _stop_cells() -> None:
    """Ctrl-C: each running cell is interrupted (it writes a checkpoint, as `fastsgd run`
    and `simulate` do on Ctrl-C), then killed if it has not stopped within 10 seconds (60
    for a hosts cell, which must delete its namespaces)."""
    with _lock:
        procs = list(_running)
        within = max((STOP_WITHIN.get(m, 10.0) for m in _running.values()), default=10.0)
    for proc in procs:
        proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + within
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.wait()


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill a cell's whole process group: its launcher and the workers it forked, which a
    kill of the launcher alone would leave behind, waiting on each other for good."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # the group is gone already
        pass


def cell_dir(root: Path, cell: Cell) -> Path:
    return root / "cells" / cell.id


def done(root: Path, cell: Cell) -> bool:
    return (cell_dir(root, cell) / "summary.json").is_file()


def run_cell(root: Path, cell: Cell, ray: Any = None,
             times: dict[str, Any] | None = None) -> str | None:
    """One cell as a process of its own, here or as a Ray task, charged the compute `times`
    another cell of its workload measured, if given; None, or the last lines of its error."""
    folder = cell_dir(root, cell)
    folder.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    config = with_times(cell, times or {})
    if ray is not None:
        try:
            code, output = run_cell_on_ray(ray, folder, cell, config)
        except Exception as e:  # noqa: BLE001 - Ray's: the task failed, its retries too
            code, output = 1, f"the Ray task failed: {str(e).strip() or type(e).__name__}"
    else:
        spec = folder.parent / f"{cell.id}.toml"
        spec.write_text(cfg.to_toml(config))
        code, output = _process(cell.mode, spec, folder)
    (folder.parent / f"{cell.id}.log").write_text(
        f"# {cell.label}, {time.perf_counter() - start:.1f} s, exit {code}\n{output}")
    return None if code == 0 else told(output) or f"exit code {code}"


def told(output: str) -> str:
    """What a failed cell's output says of its failure: its `fastsgd: error:` line (a
    worker's traceback follows it in the log), else the exception a Python traceback ends
    in, else its last ERROR_LINES lines."""
    lines = output.strip().splitlines()
    errors = [line[line.index(ERROR):] for line in lines if ERROR in line]
    if errors:
        return errors[-1]
    if TRACEBACK in lines:  # the exception's lines: after the last traceback's frames
        last = lines[len(lines) - lines[::-1].index(TRACEBACK):]
        exception = [line for line in last if line and not line[0].isspace()]
        if exception:
            return "\n  ".join(exception[:ERROR_LINES])
    return "\n  ".join(lines[-ERROR_LINES:])


def _process(mode: str, spec: Path, folder: Path) -> tuple[int, str]:
    """`fastsgd MODE SPEC` writing into `folder`: (exit code, output)."""
    # a session of its own: a terminal's Ctrl-C reaches the bench alone, which interrupts
    # each cell (_stop_cells), and the cell's processes can be killed as one group
    proc = subprocess.Popen(command(mode, spec, folder), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    with _lock:
        _running[proc] = mode
    try:
        output, _ = proc.communicate()
    finally:
        with _lock:
            _running.pop(proc, None)
        _kill_group(proc)  # whatever of the cell outlived its launcher
    return proc.returncode, output
