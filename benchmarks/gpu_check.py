"""The CUDA/NCCL path, on a machine with a GPU: codecs on the GPU agree with the CPU, and
strategies train with `run.backend = "nccl"` on the GPU.

    python benchmarks/gpu_check.py [--steps 300] [--data fashion_mnist|synthetic]

NCCL takes one GPU per rank, so with one GPU the training runs have one worker: they check
that the model, the optimizer, the codecs' payloads and the collectives (all-reduce,
all-gather, send/recv of packed uint8 buffers) all live on the GPU, not how they scale.
Exits non-zero if a check fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

# Ask NVML whether there is a GPU: the CUDA runtime's own check would poison fork(), and the
# workers are forked.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

import torch  # noqa: E402

import fastsgd as fs  # noqa: E402
from fastsgd.compress import CODECS  # noqa: E402
from fastsgd.compress.collectives import decode_buffer  # noqa: E402
from fastsgd.compress.wire import pack  # noqa: E402
from fastsgd.workloads.data import FASHION_MNIST_PATH  # noqa: E402

STOCHASTIC = {"qsgd", "randomk"}  # random draws differ between devices: compare error sizes
RUNS = [("allreduce", "none"), ("allreduce", "fp16"), ("allreduce", "qsgd"),
        ("allreduce", "topk"), ("allreduce", "dgc"), ("allreduce", "powersgd"),
        ("ssp", "onebit"), ("localsgd", "sign"), ("dpsgd", "qsgd"), ("ps", "topk"),
        ("adpsgd", "none"), ("sgp", "none")]
# dgc carrying the momentum itself (top-0.1%, no clipping) diverged on LeNet with one
# worker, on the CPU too (NaN at step 229-249), so that path is checked clipped
EXTRA = {"dgc": {"optimizer.momentum": 0.0, "compression.momentum": 0.9,
                 "compression.clip": 1.0}}


def codec_error(name: str, x: torch.Tensor) -> tuple[float, torch.Tensor, int]:
    """Relative error of one encode/pack/decode round trip on x's device, the decoded
    tensor, and the packed bytes."""
    codec = CODECS.build({"name": name})
    state = codec.init(x)
    if codec.kind == "lowrank":
        return float("nan"), x, 0
    buffer = pack(codec.encode(x, state))
    assert buffer.device == x.device, f"{name}: packed on {buffer.device}, not {x.device}"
    out = decode_buffer(codec, buffer, x, 0)
    assert out.device == x.device, f"{name}: decoded on {out.device}"
    return float((out - x).norm() / x.norm()), out, buffer.numel()


def check_codecs() -> list[str]:
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, "
          f"nccl {'.'.join(map(str, torch.cuda.nccl.version()))}", flush=True)
    failures = []
    x = torch.randn(101_770, generator=torch.Generator().manual_seed(1234))  # not the draws' seed
    for name in CODECS:
        torch.manual_seed(0)
        cpu_error, cpu_out, cpu_bytes = codec_error(name, x)
        torch.manual_seed(0)
        gpu_error, gpu_out, gpu_bytes = codec_error(name, x.cuda())
        same = (abs(gpu_error - cpu_error) <= 0.05 * max(cpu_error, 1e-6) if name in STOCHASTIC
                else torch.allclose(gpu_out.cpu(), cpu_out, rtol=1e-4, atol=1e-5))
        ok = cpu_bytes == gpu_bytes and (same or name == "powersgd")
        print(f"codec {name:9s} bytes cpu {cpu_bytes:7d} gpu {gpu_bytes:7d}  relative error "
              f"cpu {cpu_error:.4f} gpu {gpu_error:.4f}  {'ok' if ok else 'MISMATCH'}",
              flush=True)
        if not ok:
            failures.append(f"codec {name}")
    return failures


def check_training(steps: int, data: str) -> list[str]:
    failures = []
    model = "lenet" if data == "fashion_mnist" else "mlp"  # lenet learns little on 8x8
    for strategy, codec in RUNS:
        with tempfile.TemporaryDirectory() as out:
            options = {"run.steps": steps, "run.eval_every": 0, "run.out": out,
                       "run.backend": "nccl", "data.batch_size": 128, **EXTRA.get(codec, {})}
            start = time.perf_counter()
            try:
                job = fs.Job(model=model, data=data, strategy=strategy, compressor=codec,
                             options=options, quiet=True)
                summary = job.run(workers=1).summary
            except Exception as e:  # noqa: BLE001 - reported, then the next run
                print(f"train {strategy:9s} {codec:8s} FAILED: {e}", flush=True)
                failures.append(f"train {strategy}/{codec}")
                continue
        accuracy = summary["final_accuracy"]
        print(f"train {strategy:9s} {codec:8s} accuracy {accuracy:.2%} after {steps} steps, "
              f"{summary['samples_per_second']:8.0f} samples/s, "
              f"{time.perf_counter() - start:5.1f} s", flush=True)
        if not accuracy > 0.4:  # chance is 10%; top-k 1% learns slowly at first
            failures.append(f"train {strategy}/{codec}: accuracy {accuracy:.2%}")
    return failures


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    # a lent GPU machine may lack Debian's dataset package: then the synthetic images
    p.add_argument("--data", default="fashion_mnist" if os.path.isdir(FASHION_MNIST_PATH)
                   else "synthetic")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("no GPU is visible: this script checks the CUDA/NCCL path")
    failures = check_training(args.steps, args.data)  # first: workers fork before CUDA starts
    failures += check_codecs()
    print("FAILED: " + ", ".join(failures) if failures else "all checks passed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
