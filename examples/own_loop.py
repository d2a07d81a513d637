"""Keep your own training loop; fastsgd moves gradients or parameters between the workers.

    torchrun --standalone --nproc-per-node 4 examples/own_loop.py localsgd
    torchrun --standalone --nproc-per-node 2 examples/own_loop.py sgp --dataset digits

Each process is one worker: it trains its slice of every global batch with its own
optimizer, and the strategy (argv[1]: allreduce, localsgd, ps, adpsgd, sgp, ...) does the
rest. At the end rank 0 prints how far apart the replicas ended and the test accuracy.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import fastsgd as fs


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("strategy", nargs="?", default="allreduce")
    parser.add_argument("--dataset", default="fashion_mnist", choices=fs.data.DATASETS)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=0.05)
    return parser.parse_args()


def accuracy(model: torch.nn.Module, data: fs.data.Dataset) -> float:
    with torch.no_grad():
        correct = sum(int((model(x).argmax(1) == y).sum())
                      for x, y in fs.data.test_batches(data.test_x, data.test_y))
    return correct / len(data.test_y)


def main() -> None:
    args = parse_args()
    transport = fs.connect()  # joins the torchrun job (env:// rendezvous)
    data = fs.data.load_dataset(args.dataset)
    torch.manual_seed(0)
    model = fs.models.build_model("mlp", data.input_shape, data.num_classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    shard = fs.data.Shard(data.train_x, data.train_y, args.batch_size, rank=transport.rank,
                          world_size=transport.world_size, seed=0)
    replica = fs.Replica(model, transport, args.strategy, total_steps=args.epochs * len(shard))
    for epoch in range(args.epochs):
        for x, y in shard:  # this worker's slice of each global batch of the epoch
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            replica.sync_gradients()  # p.grad now holds what the optimizer should apply
            optimizer.step()
            replica.sync_parameters()  # parameter exchange, for strategies that have one
        if transport.rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f} (rank 0's last batch)")
    distance = replica.consensus_distance()  # collective: every rank calls it
    if transport.rank == 0:
        print(f"consensus distance: {distance:.3e}")
        print(f"test accuracy: {accuracy(model, data):.4f}")
    replica.close()
    transport.close()


if __name__ == "__main__":
    main()
