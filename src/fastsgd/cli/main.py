"""`fastsgd run|simulate|demo|join|report|bench|sample|topology|keys`: the command line. User errors
end in one line, exit code 2."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from fastsgd.cli import sample
from fastsgd.errors import Interrupted, UserError, WorkerFailed

USAGE_EXAMPLES = """examples:
  fastsgd demo
  fastsgd run --set run.workers=2 --set model.name=mlp
  fastsgd simulate my.toml --set run.workers=64 --set network.bandwidth=100Mbit
  fastsgd run runs/allreduce-20261126-101500/config.toml     repeat a run (in a new folder)
  fastsgd run --resume runs/allreduce-20261126-101500        continue it from its checkpoint
  fastsgd join runs/sgp-20261126-101500                      take a lost worker's place
  fastsgd report runs/a runs/b --out cmp                     tables, plots, one HTML page
  fastsgd bench sweep.toml --jobs 2                          a matrix of runs, then a report
  fastsgd sample runs/diloco-20261126-101500 --prompt "def "  text from a run's GPT
  fastsgd pack train.py --out job.fsj                        a job without its source
  fastsgd run job.fsj --data fashion_mnist                   train it
  fastsgd keys                                               every config key
"""
KEYS_HINT = "every section and key, with defaults: fastsgd keys"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastsgd", epilog=USAGE_EXAMPLES, formatter_class=argparse.RawTextHelpFormatter,
        description="FAST: Flexible (A)synchronous Scalable Training")
    parser.add_argument("--version", action="version", version=f"fastsgd {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    helps = {"run": "train on real worker processes (torch.distributed)",
             "simulate": "train on a simulated cluster (virtual clock and network)",
             "demo": "LeNet on Fashion-MNIST, 4 worker processes, synchronous all-reduce"}
    for name, text in helps.items():
        p = sub.add_parser(name, help=text, description=text, epilog=KEYS_HINT)
        if name != "demo":
            p.add_argument("config", nargs="?", help="TOML file (default: the demo's settings)")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override one key, e.g. --set run.workers=8 (repeatable)")
        p.add_argument("--overwrite", action="store_true",
                       help="write into run.out even if it holds a run (default: a new "
                            "folder, unless --set run.out names it)")
        if name != "demo":
            p.add_argument("--resume", metavar="RUN_DIR",
                           help="continue RUN_DIR from its newest checkpoint "
                                "(run.checkpoint_every), with its config.toml")
        p.add_argument("--quiet", action="store_true", help="no progress bar")
        p.add_argument("--no-report", dest="report", action="store_false",
                       help="skip the run's own report/ (about 1.5 s of plotting; "
                            "`fastsgd report RUN_DIR` draws it later)")
        if name != "demo":
            p.add_argument("--data", default=None, metavar="NAME|FOLDER",
                           help="the dataset: a name (fashion_mnist, digits...) or a folder of "
                                "IDX files; sets data.name and data.path")
    text = "list every config section and key: type, default, meaning"
    sub.add_parser("keys", help=text, description=text)
    _join_parser(sub)
    _topology_parser(sub)
    _pack_parser(sub)
    _report_parser(sub)
    _bench_parser(sub)
    sample.add_parser(sub)
    return parser


def _bench_parser(sub: argparse._SubParsersAction) -> None:
    text = "run a matrix of runs from a spec (axes over any config key) and report on them"
    p = sub.add_parser("bench", help=text, description=text)
    p.add_argument("spec", help="TOML: [bench] mode, [base] configuration, [axes] key = [values]")
    p.add_argument("--out", default=None, help="bench directory (default: bench/SPEC-NAME)")
    p.add_argument("--jobs", type=int, default=1, help="cells run side by side (default 1)")
    p.add_argument("--max-cells", type=int, default=64,
                   help="refuse a larger matrix without --yes (default 64)")
    p.add_argument("--yes", action="store_true", help="run a matrix over --max-cells")
    p.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="run the cells as tasks of the Ray cluster at ADDRESS (auto, HOST:PORT)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _pack_parser(sub: argparse._SubParsersAction) -> None:
    text = ("write a job archive (.fsj) that trains without your Python source: the step and "
            "model as graphs, the initial parameters, the config")
    p = sub.add_parser("pack", help=text, description=text, epilog=KEYS_HINT)
    p.add_argument("source", help="train.py (defining one fastsgd.Job at module level; "
                                  "train.py:NAME picks one) or a TOML config")
    p.add_argument("--out", default=None, help="the archive (default: SOURCE's name .fsj)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one key of the job's config (repeatable)")


def _pack(args: argparse.Namespace) -> int:
    from fastsgd.cli.scripts import job_from_source
    from fastsgd.config import schema as cfg

    _check_set_items(args.set, args.source)
    job, default_out = job_from_source(args.source, cfg.parse_overrides(args.set))
    written = job.pack(args.out or default_out)
    size = written.stat().st_size / 1e6
    print(f"packed {args.source} into {written} ({size:.2f} MB); train it with: "
          f"fastsgd run {written}   (or: fastsgd simulate {written})")
    return 0


def _join_parser(sub: argparse._SubParsersAction) -> None:
    text = ("take a lost worker's place in a running `fastsgd run` (run.join = true), from a "
            "live worker's state; waits for a place if every worker is running")
    p = sub.add_parser("join", help=text, description=text)
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run's directory (this machine)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _join(args: argparse.Namespace) -> int:
    from fastsgd.job import Job
    from fastsgd.launch.door import attach, knock
    from fastsgd.launch.processes import train_joined

    run_dir = Path(args.run_dir)
    stop = attach(run_dir)  # fails in one line before the data is loaded for nothing
    job = Job(resume=run_dir, quiet=args.quiet)
    plan = job.plan(job.config, writer=False)  # before it knocks: a standby joins at once

    def say(text: str) -> None:
        print(f"fastsgd join: {text}", file=sys.stderr, flush=True)

    join = knock(stop, run_dir, say)
    if join is None:
        say(f"the run in {run_dir} ended before a place came free")
        return 0
    rank, step, donor, _ = join.split(":")
    say(f"worker {rank} of {run_dir}, from step {step}, with worker {donor}'s state")
    train_joined(plan, stop, join)
    stopped = stop.stop_at.value
    say(f"worker {rank} stopped with the others after step {stopped} (Ctrl-C on the run)"
        if 0 < stopped < stop.slots["steps"] else f"worker {rank} trained to the end of the run")
    return 0


def _report_parser(sub: argparse._SubParsersAction) -> None:
    text = ("compare runs: a CSV, a Markdown table, PNG plots and one HTML page holding them "
            "(report.html)")
    p = sub.add_parser("report", help=text, description=text)
    p.add_argument("paths", nargs="+", metavar="RUN_DIR",
                   help="run directories, or folders holding them (a bench directory)")
    p.add_argument("--out", default=None,
                   help="where to write (default: PATH/report for one path, else ./report)")


def _report(args: argparse.Namespace) -> int:
    from fastsgd.report import find_runs, write_report
    from fastsgd.report.table import rows, to_markdown

    runs = find_runs(args.paths)
    out = args.out or (f"{args.paths[0]}/report" if len(args.paths) == 1 else "report")
    written = write_report(runs, out)
    print(to_markdown(rows(runs)), end="")
    print(f"report: {', '.join(p.name for p in written)} in {out}")
    return 0


def _topology_parser(sub: argparse._SubParsersAction) -> None:
    from fastsgd.topology.show import EDGES, MAX_WORKERS

    text = "show a topology: neighbours, mixing weights, spectral gap, and a PNG drawing"
    p = sub.add_parser("topology", help=text, description=text)
    p.add_argument("name", help="complete, star, ring, torus, hypercube, exponential, "
                                "onepeer, random, custom")
    p.add_argument("--workers", type=int, required=True, help=f"1 to {MAX_WORKERS}")
    p.add_argument("--weights", default="uniform", help="uniform | metropolis")
    p.add_argument("--rows", type=int, help="torus: grid rows (default: the squarest grid)")
    p.add_argument("--cols", type=int, help="torus: grid columns")
    p.add_argument("--degree", type=int, help="random graphs (default: up to 4)")
    p.add_argument("--seed", type=int, help="random graphs (default 0)")
    p.add_argument("--edges", default=None, help="custom graphs: undirected edges, e.g. 0-1,1-2")
    p.add_argument("--step", type=int, default=0, help="time-varying graphs: which step, >= 0")
    p.add_argument("--png", default=None, help="drawing (default: topology-NAME-N.png); "
                                                f"beyond {EDGES} edges, the ranks only")


def _show_topology(args: argparse.Namespace) -> int:
    from fastsgd.topology.show import show

    return show(**{k: v for k, v in vars(args).items() if k != "command"})


def _version() -> str:
    from fastsgd.config import VERSION

    return VERSION


def main(argv: list[str] | None = None) -> int:
    if threading.current_thread() is threading.main_thread():
        # Ctrl-C is a KeyboardInterrupt from the start, also in a process that inherited
        # SIGINT ignored (as interrupt.catching says): torch's import alone takes seconds
        signal.signal(signal.SIGINT, signal.default_int_handler)
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except UserError as e:
        print(f"fastsgd: error: {e}", file=sys.stderr)
        return 2
    except WorkerFailed as e:  # a worker's traceback, if it had one, is in the message
        print(f"fastsgd: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:  # Interrupted says how far the run got and how to resume
        if str(e) or not isinstance(e, Interrupted):  # (under torchrun, rank 0 says it)
            print(f"fastsgd: {str(e) or 'interrupted'}", file=sys.stderr)
        # CPython marks a KeyboardInterrupt that ended a string exec (dataclasses and
        # namedtuple build their methods so, e.g. in torch's import) as never handled, and
        # `python -m` then ends by SIGINT whatever it returns; a string exec clears the mark
        exec("")
        return 130
    except BrokenPipeError:  # the reader left (fastsgd keys | head): no traceback, as `cat`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor at exit's flush
        return 128 + signal.SIGPIPE


def _dispatch(args: argparse.Namespace) -> int:
    from fastsgd.control.interrupt import held

    with held():  # Ctrl-C in the seconds these take: "interrupted" once they are done
        from fastsgd.config import schema as cfg
        from fastsgd.job import Job
        from fastsgd.report import text_report, write_run_report

    if args.command == "topology":
        return _show_topology(args)
    if args.command == "report":
        return _report(args)
    if args.command == "join":
        return _join(args)
    if args.command == "sample":
        return sample.run(args)
    if args.command == "pack":
        return _pack(args)
    if args.command == "bench":
        from fastsgd.bench import run_bench

        failed = run_bench(args.spec, args.out, args.jobs, args.max_cells, args.yes, args.quiet,
                           args.ray)
        return 1 if failed else 0
    if args.command == "keys":
        from fastsgd.strategies import CHOICES

        print(cfg.describe_keys(CHOICES))
        return 0
    path = getattr(args, "config", None)
    _check_set_items(args.set, path)
    options = {**cfg.parse_overrides(args.set), **_data_option(getattr(args, "data", None))}
    job = Job(config=path, options=options, quiet=args.quiet,
              overwrite=args.overwrite, resume=getattr(args, "resume", None), report=False)
    config = job.config
    if args.command == "demo":
        print(f"fastsgd demo: {config['model']['name']} on {config['data']['name']}, "
              f"{config['run']['workers']} worker processes, {config['strategy']['name']}",
              file=sys.stderr)
    result = job.simulate() if args.command == "simulate" else job.run()
    if result.summary is not None:
        *lines, last = text_report(result.run_dir).splitlines()
        if args.report:
            lines.append(f"report         {write_run_report(result.run_dir)}")
        print("\n".join([*lines, last]))  # the folder stays last
    return 0


def _data_option(value: str | None) -> dict[str, str]:
    """--data NAME or --data FOLDER (IDX files) as data.name and data.path."""
    from fastsgd.errors import ConfigError

    if value is None:
        return {}
    if Path(value).is_dir():
        return {"data.name": "idx", "data.path": value}
    if "/" in value and ":" not in value:  # a folder, not a dataset's name nor module:function
        raise ConfigError(f"--data {value}: no such folder")
    return {"data.name": value, "data.path": ""}


def _check_set_items(items: list[str], path: str | None) -> None:
    """`--set run.workers 4` leaves the 4 where the config file goes: say the right form."""
    from fastsgd.errors import ConfigError

    for item in items:
        if "=" not in item:  # (a config file or a script is no stray value)
            value = "VALUE" if path is None or path.endswith((".toml", ".fsj", ".py")) or \
                ".py:" in path or Path(path).is_file() else path
            raise ConfigError(f"--set {item}: write KEY=VALUE as one word, "
                              f"e.g. --set {item}={value}")


if __name__ == "__main__":
    sys.exit(main())
