import os
import signal
import subprocess
import time
from pathlib import Path

os.environ.setdefault("MKL_DISABLE_FAST_MM", "1")  # before MKL's first call: see fastsgd/__init__

import pytest  # noqa: E402
import torch  # noqa: E402

from fastsgd.workloads.data import load_dataset  # noqa: E402
from fastsgd.workloads.models import build_model  # noqa: E402

MAX_PARALLEL = 8  # test processes at once (pytest-xdist): many tests start several workers


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject.toml): a test process per core, at most MAX_PARALLEL. Half the
    suite's time is multi-process tests waiting (for workers to start, a loss to be
    detected, a deadline), so two at once on two cores took 14 minutes where one took 23."""
    return max(1, min(MAX_PARALLEL, os.cpu_count() or 1))


# intra-op threads: the cores shared among the test processes (two OpenMP threads of one
# process fighting another process for a core stall every op)
_PARALLEL = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // _PARALLEL)))

# Subprocesses (the CLI, torchrun) import this checkout's fastsgd too.
_ROOT = Path(__file__).resolve().parents[1]
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(_ROOT / "src"), str(_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])


@pytest.fixture(scope="session")
def synthetic():
    return load_dataset("synthetic", seed=0)


def reference_sgd(dataset, batch_size, steps, lr=0.05, momentum=0.9, seed=0, model="mlp",
                  **sgd):
    """Plain PyTorch, one worker, the same samples in the same order: the ground truth
    (`sgd`: more arguments of torch.optim.SGD)."""
    from fastsgd.workloads.data import Shard

    torch.manual_seed(seed)
    net = build_model(model, dataset.input_shape, dataset.num_classes)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, **sgd)
    shard = Shard(dataset.train_x, dataset.train_y, batch_size, 0, 1, seed)
    for k in range(steps):
        x, y = shard.batch(k)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return net.state_dict()


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _why_no_namespaces() -> str | None:
    from fastsgd.bench import netns

    try:
        netns.check_can_emulate(f"fsgdtest{os.getpid()}")
    except netns.Refused as e:
        return str(e)
    return None


WHY_NO_NAMESPACES = _why_no_namespaces()  # None where emulated hosts can be made
needs_namespaces = pytest.mark.skipif(WHY_NO_NAMESPACES is not None,
                                      reason=f"no emulated hosts here: {WHY_NO_NAMESPACES}")
# tests that make emulated hosts run one after another, in one test process: they check that
# no namespace of fastsgd's is left, which another such test running meanwhile would break
one_host_test_at_a_time = pytest.mark.xdist_group("network-namespaces")


def orphans(marker: str) -> list[int]:
    """Processes whose command line holds `marker`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            pass
    return found


def interrupt_once_training(cmd: list[str], out: Path, sig: int = signal.SIGINT,
                            group: bool = False, past_step: int = 0,
                            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Start `cmd` (a run writing to `out`), send it `sig` once training has started (and
    logged a step past `past_step`), to its whole process group, as `timeout` or a closing
    terminal do, if `group`; check it ends within 5 s; what it printed on stderr and its exit
    code."""
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, start_new_session=group,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    deadline = time.monotonic() + 120
    while not _logged_past(out / "metrics.jsonl", past_step) and time.monotonic() < deadline:
        time.sleep(0.2)  # training has started
    began = time.monotonic()
    if group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - began < 5, err[-3000:]
    return subprocess.CompletedProcess(cmd, proc.returncode, "", err)


def _logged_past(metrics: Path, step: int) -> bool:
    if not metrics.exists():
        return False
    return step == 0 or f'"step": {step + 1},' in metrics.read_text()


def pytest_collection_modifyitems(items):
    """The slow tests (the demo, 2-3 minutes) run first, so that the other test processes
    fill the time beside them rather than wait for them at the end (pytest-xdist hands out
    tests in this order). JAX's tests run last: once JAX's runtime has started in this
    process, every later fork of it (the tests' worker processes) forks JAX's idle thread
    pools along. The children never call JAX, so it is harmless, but JAX warns at each fork."""
    def place(item: pytest.Item) -> int:
        if "tests/frameworks/" in item.nodeid.replace("\\", "/"):
            return 2
        return 0 if item.get_closest_marker("slow") else 1

    items.sort(key=place)
