"""The report's plots as PNG bytes: accuracy against time and against bytes, the stacked
per-iteration breakdown, scaling efficiency against workers, consensus against time.
Each returns None when its runs have nothing to show (one run has no scaling curve).
matplotlib's object API with the Agg canvas: no pyplot state, no display needed."""

from __future__ import annotations

import io
import math
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from fastsgd.records.metrics import PHASES
from fastsgd.report.clocks import AXIS, CLOCKS
from fastsgd.report.runs import RunData
from fastsgd.workloads.kinds import LOSS_KINDS, REGRESSION

WIDTH, HEIGHT, DPI = 7.0, 4.0, 100
LEGEND_MAX = 12  # curves named in a legend


def _figure(draw: Callable[..., None], height: float = HEIGHT, width: float = WIDTH,
            panels: int = 1) -> bytes:
    """A PNG of `draw(ax, ...)` on `panels` plots side by side, which share their y axis."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width if panels == 1 else 0.7 * width * panels, height), dpi=DPI,
                 layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, panels, sharey=True, squeeze=False)[0]
    for ax in axes:
        ax.grid(alpha=0.3)
    draw(*axes)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _lines(runs: list[RunData], series: Callable[[RunData], list[tuple[float, float]]],
           xlabel: str, ylabel: str, logx: bool = False) -> bytes | None:
    curves = [(r.name, series(r)) for r in runs]
    curves = [(name, points) for name, points in curves if points]
    if not curves:
        return None

    def draw(ax: Any) -> None:
        for name, points in curves:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o" if len(points) < 20 else None, label=name)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if logx:
            xs = [x for _, points in curves for x, _ in points]
            log_axis(ax.xaxis, min(xs), max(xs))
        _legend(ax, len(curves))
    return _figure(draw)


def _time_lines(runs: list[RunData], series: Callable[[RunData], list[tuple[float, float]]],
                ylabel: str) -> bytes | None:
    """Curves against time: one panel per clock (simulated, measured, unknown), each with
    its own time axis, since seconds of one are not seconds of another; a run keeps its
    colour across panels."""
    curves = [(r.clock, r.name, points, f"C{i % 10}")
              for i, r in enumerate(runs) if (points := series(r))]
    panels = [(clock, [c[1:] for c in curves if c[0] == clock]) for clock in CLOCKS]
    panels = [(clock, lines) for clock, lines in panels if lines]
    if not panels:
        return None

    def draw(*axes: Any) -> None:
        for ax, (clock, lines) in zip(axes, panels):
            for name, points, colour in lines:
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker="o" if len(points) < 20 else None, label=name,
                        color=colour)
            ax.set_xlabel(AXIS[clock])
            _legend(ax, len(lines))
        axes[0].set_ylabel(ylabel)
    return _figure(draw, panels=len(panels))


def log_axis(axis: Any, low: float, high: float) -> None:
    """A log scale for values from `low` to `high` (linear below 1, where 0 bytes lies),
    ticked densely enough to read: every digit within a decade, 1, 2 and 5 over a few, each
    decade over more; less than half a decade stays linear, where a log scale shows nothing."""
    from matplotlib.ticker import FuncFormatter, SymmetricalLogLocator

    decades = math.log10(max(high, 1.0) / max(low, 1.0))
    if decades < 0.5:
        return
    subs = range(1, 10) if decades < 1 else (1.0, 2.0, 5.0) if decades < 4 else (1.0,)
    axis.axes.set_xscale("symlog", linthresh=1.0)
    axis.set_major_locator(SymmetricalLogLocator(base=10, linthresh=1.0, subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))


def accuracy_vs_time(runs: list[RunData]) -> bytes | None:
    runs = _with_accuracy(runs)
    return _time_lines(runs, lambda r: [(e["time"], e["accuracy"]) for e in r.evals],
                       "test accuracy")


def _with_accuracy(runs: list[RunData]) -> list[RunData]:
    """The runs whose evaluations have an accuracy (a regression's have none)."""
    return [r for r in runs if r.summary.get("data_kind") != REGRESSION]


def _loss_axis(runs: list[RunData]) -> str:
    kinds = {r.summary.get("data_kind") for r in runs}
    unit = "mean squared error" if kinds == {REGRESSION} else "nats per token"
    return f"validation loss ({unit})"


def _scored_by_loss(runs: list[RunData]) -> list[RunData]:
    """The runs with a loss target or a language model's data (text, tokens)."""
    return [r for r in runs if (r.target or ("",))[0] == "loss"
            or r.summary.get("data_kind") in LOSS_KINDS]


def loss_vs_bytes(runs: list[RunData]) -> bytes | None:
    chosen = _scored_by_loss(runs)
    return _lines(chosen, lambda r: [(b / 1e6, v) for b, v in r.by_bytes("loss")],
                  "MB sent by all workers", _loss_axis(chosen), logx=True) if chosen else None


def loss_vs_time(runs: list[RunData]) -> bytes | None:
    """The validation loss against time, for runs with a loss target or a language model's
    data (text, tokens); None if there are none."""
    chosen = _scored_by_loss(runs)
    return _time_lines(chosen, lambda r: [(e["time"], e["loss"]) for e in r.evals
                                          if isinstance(e.get("loss"), int | float)
                                          and math.isfinite(e["loss"])],
                       _loss_axis(chosen))


def accuracy_vs_bytes(runs: list[RunData]) -> bytes | None:
    runs = _with_accuracy(runs)
    return _lines(runs, lambda r: [(b / 1e6, a) for b, a in r.accuracy_by_bytes()],
                  "MB sent by all workers", "test accuracy", logx=True) if runs else None


def consensus_vs_time(runs: list[RunData]) -> bytes | None:
    series = [r for r in runs if any(e.get("consensus_distance") for e in r.evals)]
    return _time_lines(series, lambda r: [(e["time"], e["consensus_distance"])
                                          for e in r.evals
                                          if e.get("consensus_distance") is not None],
                       "consensus distance")


def breakdown(table: list[dict[str, Any]]) -> bytes | None:
    """Stacked bars: the mean time per step of each phase, one bar per run."""
    if not table:
        return None
    clocks = {r["clock"] for r in table}  # one: named on the axis; else beside each bar
    mark = (lambda r: f" ({r['clock']})") if len(clocks) > 1 else (lambda r: "")

    def draw(ax: Any) -> None:
        left = [0.0] * len(table)
        labels = [f"{r['strategy']}/{r['codec']} x{r['workers']}\n{r['run']}{mark(r)}"
                  for r in table]
        for phase in PHASES:
            widths = [r[f"{phase}_ms"] for r in table]
            ax.barh(labels, widths, left=left, label=phase)
            left = [a + b for a, b in zip(left, widths)]
        clock = next(iter(clocks)) if len(clocks) == 1 else "each run's own clock"
        ax.set_xlabel(f"ms per step (mean over workers and steps; {clock})")
        ax.invert_yaxis()
        ax.legend(fontsize="small", ncols=len(PHASES), loc="lower center",
                  bbox_to_anchor=(0.5, 1.0))
    longest = max(len(r["run"] + mark(r)) for r in table)  # room for the labels beside the bars
    return _figure(draw, height=max(HEIGHT, 1.5 + 0.45 * len(table)),
                   width=WIDTH + 0.07 * longest)


def scaling(table: list[dict[str, Any]]) -> bytes | None:
    """Scaling efficiency against workers, one line per job (its runs at other worker
    counts), the mean over its seeds."""
    points: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    names: dict[str, str] = {}
    for r in table:
        if r["scaling_efficiency"] is not None:
            points[r["job"]][r["workers"]].append(r["scaling_efficiency"])
            names[r["job"]] = r["series"]
    curves = {names[job]: sorted((n, sum(v) / len(v)) for n, v in by.items())
              for job, by in points.items() if len(by) > 1}
    if not curves:
        return None

    def draw(ax: Any) -> None:
        for name, line in curves.items():
            xs, ys = zip(*line)
            ax.plot(xs, ys, marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers")
        ax.set_ylabel("scaling efficiency (vs 1 worker)")
        ax.axhline(1.0, color="gray", linewidth=0.8)
        _legend(ax, len(curves))
    return _figure(draw)


def staleness(runs: list[RunData]) -> bytes | None:
    """How stale the gradients or models each step used were: the share of worker-steps
    at each staleness, one line per run that had any."""
    counts = {}
    for r in runs:
        seen = Counter(int(m["staleness"]) for m in r.metrics if m.get("staleness") is not None)
        if any(k > 0 for k in seen):
            counts[r.name] = seen
    if not counts:
        return None

    from matplotlib.ticker import MaxNLocator

    def draw(ax: Any) -> None:  # a histogram per run, their bars side by side
        width = 0.8 / len(counts)
        for i, (name, seen) in enumerate(counts.items()):
            total = sum(seen.values())
            xs = sorted(seen)
            ax.bar([x - 0.4 + (i + 0.5) * width for x in xs], [seen[x] / total for x in xs],
                   width=width, label=name)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("staleness (steps)")
        ax.set_ylabel("share of worker-steps")
        _legend(ax, len(counts))
    return _figure(draw)


def _legend(ax: Any, curves: int) -> None:
    """Name the curves, where any has a name (none: no empty box, and no warning)."""
    if curves <= LEGEND_MAX:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    else:  # more would hide the plot: the table names them
        ax.set_title(f"{curves} runs (too many to name here: see the table)", fontsize="small")


PLOTS = (  # file name, title, what draws it (from the runs or the table)
    ("accuracy_time.png", "Accuracy against time", lambda runs, table: accuracy_vs_time(runs)),
    ("loss_time.png", "Validation loss against time", lambda runs, table: loss_vs_time(runs)),
    ("accuracy_bytes.png", "Accuracy against bytes sent",
     lambda runs, table: accuracy_vs_bytes(runs)),
    ("loss_bytes.png", "Validation loss against bytes sent",
     lambda runs, table: loss_vs_bytes(runs)),
    ("breakdown.png", "Per-iteration breakdown", lambda runs, table: breakdown(table)),
    ("scaling.png", "Scaling efficiency", lambda runs, table: scaling(table)),
    ("consensus.png", "Consensus distance against time",
     lambda runs, table: consensus_vs_time(runs)),
    ("staleness.png", "Staleness", lambda runs, table: staleness(runs)),
)
