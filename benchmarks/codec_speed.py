"""Encode and decode throughput of every codec, on one thread, in GB/s of the fp32 input.

    python benchmarks/codec_speed.py [--sizes 1 16] [--repeats 9] [--warmup 2]
                                     [--codecs onebit qsgd ...] [--threads 1]
                                     [--device cpu|cuda] [--json]

For each codec (defaults of `[compression]`) and each size (MB of fp32 input, default 1 and
16), the tensor is N(0, 1) from a fixed seed, and:

- encode is `codec.encode(x, state)`, what the strategies call: with the codec's default
  error feedback (onebit, sign, topk, randomk), DGC's momentum correction, and for
  `powersgd` its `all_reduce` on a one-worker transport (the two factor products, the QR and
  the residual: what a worker computes besides the network);
- decode is `codec.decode(payload, x)` of that encode's payload (for `powersgd`, p q^T);
- `clone` is `x.clone()`, the memory-speed yardstick.

Each figure is bytes of fp32 input over the median of `--repeats` timings after `--warmup`
untimed runs (the state carries over from run to run, as in training). The medians of the
thread's CPU time are in the JSON too: on a shared machine they are steadier than wall time.
Prints the machine (CPU model, cores, load average), the torch version and whether the
codecs' compiled loops ran (compress/kernels.py; FASTSGD_KERNELS=0 times the torch code),
then a Markdown table; `--json` prints all of it as JSON instead. `--device cuda` times on the GPU
(synchronizing around each run) and refuses when CUDA is absent.

Today's figures, before and after, are in docs/compression.md ("Encode and decode speed").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch
from common import cpu_name

from fastsgd.compress import CODECS, kernels
from fastsgd.compress.powersgd import shape_of

ORDER = ["none", "fp16", "bf16", "onebit", "sign", "qsgd", "topk", "randomk", "dgc", "powersgd"]


class OneWorker:
    """A transport of one worker: an all-reduce leaves the tensor as it is."""

    world_size = 1
    rank = 0

    def all_reduce(self, tensor: torch.Tensor, async_op: bool = False):
        return None




def machine(device: torch.device) -> dict:
    info = {"cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "device": str(device),
            "python": platform.python_version()}
    if hasattr(os, "getloadavg"):
        info["load_average"] = [round(v, 2) for v in os.getloadavg()]
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    module = kernels.loops()  # the compiled CPU loops (compress/kernels.py), or off
    info["loops"] = f"numba {module.numba.__version__}" if module is not None else "off"
    return info


def timed(run, sync, repeats: int, warmup: int) -> tuple[float, float]:
    """Median wall and thread-CPU seconds of `run()` over `repeats`, after `warmup` runs."""
    for _ in range(warmup):
        run()
    sync()
    walls, cpus = [], []
    for _ in range(repeats):
        sync()
        wall, cpu = time.perf_counter(), time.thread_time()
        run()
        sync()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.thread_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def measure(name: str, x: torch.Tensor, sync, repeats: int, warmup: int) -> dict:
    if name == "clone":
        encode = decode = lambda: x.clone()  # noqa: E731
    else:
        codec = CODECS.build({"name": name})
        state = codec.init(x)
        if codec.kind == "lowrank":
            transport = OneWorker()

            def encode():
                return codec.all_reduce(x, state, transport)

            encode()
            rows, rank = shape_of(x.numel())[0], state["q"].shape[1]
            payload = {"p": torch.randn(rows, rank, device=x.device, dtype=x.dtype),
                       "q": state["q"]}
        else:
            def encode():
                return codec.encode(x, state)

            payload = encode()

        def decode():
            return codec.decode(payload, x)

    nbytes = x.numel() * x.element_size()
    out = {}
    for phase, run in (("encode", encode), ("decode", decode)):
        wall, cpu = timed(run, sync, repeats, warmup)
        out[phase] = {"gb_s": nbytes / wall / 1e9, "cpu_gb_s": nbytes / max(cpu, 1e-9) / 1e9,
                      "ms": wall * 1e3}
    return out


def table(results: dict, sizes: list[float]) -> str:
    head = ["codec"] + [f"{s:g} MB {phase}" for s in sizes for phase in ("encode", "decode")]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] * len(head)) + " |"]
    for name, by_size in results.items():
        cells = [name]
        for s in sizes:
            for phase in ("encode", "decode"):
                cells.append(f"{by_size[f'{s:g}'][phase]['gb_s']:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[1, 16],
                        help="MB of fp32 input (default 1 16)")
    parser.add_argument("--codecs", nargs="+", default=ORDER, choices=ORDER + ["clone"])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--json", action="store_true", help="print JSON, not a table")
    args = parser.parse_args(argv)

    if args.device == "cuda" and not torch.cuda.is_available():
        print("codec_speed: --device cuda asked for, but CUDA is not available here "
              f"(torch {torch.__version__}); run without --device cuda", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    codecs = ["clone"] + [c for c in args.codecs if c != "clone"]
    results: dict[str, dict] = {}
    for name in codecs:
        results[name] = {}
        for size in args.sizes:
            n = int(size * 2**20) // 4
            x = torch.randn(n, generator=torch.Generator().manual_seed(0)).to(device)
            torch.manual_seed(0)
            results[name][f"{size:g}"] = measure(name, x, sync, args.repeats, args.warmup)

    info = machine(device)
    if args.json:
        print(json.dumps({"machine": info, "sizes_mb": args.sizes, "repeats": args.repeats,
                          "warmup": args.warmup, "results": results}, indent=1))
        return 0
    load = info.get("load_average")
    print(f"{info['cpu']}, {info['cores']} cores"
          + (f", load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}" if load else "")
          + f"; torch {info['torch']}, {args.threads} thread(s), device {device}"
          + f", compiled loops {info['loops']}"
          + (f" ({info['gpu']})" if "gpu" in info else ""))
    print(f"GB/s of fp32 input, median of {args.repeats} after {args.warmup} warm-up runs\n")
    print(table(results, args.sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
