"""A training script started by torchrun (any number of nodes, one worker per process).

    torchrun --nnodes 1 --nproc-per-node 4 torchrun_train.py OUT {job|replica|default-out}

`job` uses the Job API (Job.run joins the torchrun job); `replica` keeps its own loop and
lets fastsgd deliver the peers' gradients (the paper's contract); `default-out` is `job`
without run.out (OUT is ignored): the run directory gets its default name.
"""

import sys
from pathlib import Path

import torch

import fastsgd as fs

STEPS, BATCH = 50, 16


def with_job(out: Path | None) -> None:
    options = {"run.steps": STEPS, "data.batch_size": BATCH, "optimizer.lr": 0.05,
               "optimizer.momentum": 0.9, **({"run.out": str(out)} if out else {})}
    fs.Job(model="mlp", data="synthetic", options=options, quiet=True).run()


def with_own_loop(out: Path) -> None:
    transport = fs.connect()
    data = fs.data.load_dataset("synthetic")
    torch.manual_seed(0)
    model = fs.models.build_model("mlp", data.input_shape, data.num_classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    replica = fs.Replica(model, transport, "allreduce")
    shard = fs.data.Shard(data.train_x, data.train_y, BATCH, transport.rank,
                          transport.world_size, seed=0)
    for k in range(STEPS):
        x, y = shard.batch(k)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        replica.sync_gradients()
        optimizer.step()
        replica.sync_parameters()
    if transport.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), out / "model.pt")
    replica.close()
    transport.close()


if __name__ == "__main__":
    target, mode = Path(sys.argv[1]), sys.argv[2]
    if mode == "replica":
        with_own_loop(target)
    else:
        with_job(target if mode == "job" else None)
