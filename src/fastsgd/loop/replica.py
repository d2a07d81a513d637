"""The paper's contract for a user who keeps their own loop.

    transport = fastsgd.connect()                      # under torchrun
    replica = fastsgd.Replica(model, transport, "allreduce", optimizer=optimizer)
    for x, y in my_loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        replica.sync_gradients()                       # peers' gradients are now in p.grad
        optimizer.step()
        replica.sync_parameters()                      # parameter exchange, if the strategy has one

fastsgd moves the gradients; the user's optimizer applies them. Given the optimizer, a
strategy can see whether it has momentum (allreduce then compresses each worker's update
rather than its gradient: strategies/correction.py). A strategy that averages or
drains on its last step (capabilities.drains_at_end) needs `total_steps`, the number of
sync_parameters calls in the run (examples/own_loop.py).
"""

from __future__ import annotations

import hashlib
import warnings
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from fastsgd.compress import Compressor, Identity, build_compressor
from fastsgd.compress.metered import Metered
from fastsgd.errors import UserError
from fastsgd.strategies import (
    Context,
    Strategy,
    build_strategy,
    capabilities_of,
    check_strategy,
    hook,
)
from fastsgd.strategies.base import check_codec
from fastsgd.transport.base import Transport


class Replica:
    """One worker's model replica, bound to a global strategy over a transport."""

    def __init__(self, model: torch.nn.Module, transport: Transport,
                 strategy: Strategy | str = "allreduce",
                 compressor: Compressor | str | None = None, total_steps: int | None = None,
                 optimizer: torch.optim.Optimizer | None = None, joining: bool = False):
        if isinstance(strategy, str):
            strategy = build_strategy({"name": strategy})
        else:  # the user's object: its class keeps the contract (one line if not)
            check_strategy(strategy)
        if isinstance(compressor, str):
            compressor = build_compressor({"name": compressor})
        self.model = model
        # floating-point buffers (BatchNorm's running statistics) go to the strategy with the
        # parameters: strategies that move parameters move them alike (averaging, gossip, the
        # parameter server); allreduce averages them; ssp leaves them to each worker
        self.params = replica_tensors(model)
        self.strategy = strategy
        codec = compressor or Identity()
        if codec.name != "none":  # its time charged as much as it encodes (the simulator)
            elements = sum(p.numel() for p in model.parameters() if p.requires_grad) or 1
            codec = Metered(codec, lambda n: transport.compute("codec", self.ctx.step,
                                                               share=n / elements))
        self.ctx = Context(transport, codec, total_steps=total_steps, optimizer=optimizer)
        self._warned = False
        check_codec(strategy, self.ctx.compressor, transport.world_size)
        if not joining:  # a worker joining a running job gets its state from a peer
            check_same_model(model, transport)
            self.broadcast_from(0)
        self.state: dict[str, Any] = strategy.init(self.params, self.ctx)
        # what the step runs forward through: the model, or a strategy's wrapper of it (ddp)
        wrap = hook(strategy, "wrap")
        self.forward_module = wrap(model, self.ctx) if wrap is not None else model

    @property
    def transport(self) -> Transport:
        return self.ctx.transport

    @property
    def total_steps(self) -> int | None:
        """How many times sync_parameters will be called in all: strategies that drain
        at the end (capabilities.drains_at_end) need it to know their last step."""
        return self.ctx.total_steps

    @total_steps.setter
    def total_steps(self, steps: int | None) -> None:
        self.ctx.total_steps = steps

    def broadcast_from(self, src: int) -> None:
        """Make every replica start from rank `src`'s parameters and buffers."""
        with torch.no_grad():
            for t in [*self.model.parameters(), *self.model.buffers()]:
                self.transport.broadcast(t.data, src)

    def no_sync(self) -> AbstractContextManager[object]:
        """Backward passes inside only add up their gradients (as torch DDP's no_sync): run
        every micro-batch but the last in it, then sync_gradients once."""
        no_sync = getattr(self.strategy, "no_sync", None)
        return no_sync() if callable(no_sync) else nullcontext()

    def sync_gradients(self) -> None:
        """Between backward and the optimizer step."""
        self.strategy.on_gradients(self.params, self.state, self.ctx)

    def sync_parameters(self) -> None:
        """After the optimizer step; ends the iteration."""
        if self.ctx.total_steps is None and not self._warned:
            self._warn_no_last_step()
        self.strategy.on_parameters(self.params, self.state, self.ctx)
        self.ctx.step += 1

    def _warn_no_last_step(self) -> None:
        self._warned = True
        if capabilities_of(self.strategy).drains_at_end:
            warnings.warn(f"strategy '{self.strategy.name}' averages or drains on its last step "
                          "but does not know which step that is: pass Replica(..., "
                          "total_steps=N) (or set replica.total_steps), else the replicas "
                          "end apart", stacklevel=3)

    def restart(self) -> None:
        """Rebuild the strategy's runtime handles (hooks, buckets, handles in flight) and
        keep its state: after a collective failed and the group shrank (recovery.py)."""
        self.strategy.close()
        self.strategy.init(self.params, self.ctx)

    def settle(self) -> None:
        """Before a checkpoint, on every worker: let the strategy finish what it has in
        flight (messages, requests), so that its state is all there is (optional
        `strategy.settle(params, state, ctx)`). Then a barrier, and `state_dict`."""
        settle = hook(self.strategy, "settle")
        if settle is not None:
            settle(self.params, self.state, self.ctx)

    def state_dict(self) -> dict[str, Any]:
        """What this replica must keep to resume: the step and the strategy's state, which
        holds the codec's (residuals, momentum, counters), all plain tensors and numbers.
        Model and optimizer state are the user's, saved beside it."""
        saved = {"step": self.ctx.step, "strategy": self.state}
        in_flight = hook(self.strategy, "in_flight_state")
        if in_flight is not None:  # work it holds back between steps (ssp)
            saved["in_flight"] = in_flight()
        return saved

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """`saved` as a checkpoint holds it, on the CPU: each tensor goes back to the device
        where this replica keeps its counterpart (the worker's GPU under NCCL)."""
        self.ctx.step = int(saved["step"])
        device = self.transport.device
        strategy = _placed_like(saved["strategy"], self.state, device)
        self.state.clear()  # in place: a strategy's handlers may hold the dict
        self.state.update(strategy)
        if "in_flight" in saved:
            self.strategy.load_in_flight(_placed_like(saved["in_flight"], None, device))

    def consensus_distance(self) -> float:
        """Mean over workers of the squared distance of their parameters to the average."""
        self.transport.barrier()  # a consistent snapshot: nobody is still stepping
        with torch.no_grad():
            # one float64 copy per worker while it waits for the others, not two: with
            # 1024 simulated workers in one process each extra copy of a 1 MB float32
            # model costs 2 GB
            # a 1 rides along and counts the workers in the sum (once workers are lost)
            one = torch.ones(1, dtype=torch.float64, device=self.params[0].device)
            mean = torch.cat([*(p.detach().reshape(-1).double() for p in self.params), one])
            self.transport.all_reduce(mean)
            mean /= mean[-1].item()
            spread = torch.tensor([0.0, 1.0], dtype=torch.float64, device=mean.device)
            for p, center in zip(self.params, mean[:-1].split([p.numel() for p in self.params])):
                spread[0] += (p.detach().reshape(-1).double() - center).square().sum()
            del mean
            self.transport.all_reduce(spread)
            return float(spread[0] / spread[1])

    def close(self) -> None:
        self.strategy.close()


def replica_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """The tensors that make up a replica, as its strategy gets them: parameters, then
    floating-point buffers."""
    return [*model.parameters(), *(b for b in model.buffers() if b.is_floating_point())]


def check_same_model(model: torch.nn.Module, transport: Transport) -> None:
    """Every replica must have the same architecture (a hash of its parameters' and
    buffers' names, shapes and dtypes, compared on every worker); else one line that names
    the first worker that differs from worker 0, before anything is exchanged."""
    spec = ";".join(f"{name}:{tuple(t.shape)}:{t.dtype}"
                    for name, t in [*model.named_parameters(), *model.named_buffers()])
    digest = int.from_bytes(hashlib.sha256(spec.encode()).digest()[:7], "big")
    mine = torch.tensor([digest], dtype=torch.int64, device=transport.device)
    hashes = [int(h) for h in transport.all_gather(mine)]
    differ = [rank for rank, h in enumerate(hashes) if h != hashes[0]]
    if differ:
        raise UserError(f"worker {differ[0]}'s model is not worker 0's (parameter names, "
                        "shapes or dtypes differ): every replica must have the same "
                        "architecture")


def _placed_like(saved: Any, fresh: Any, device: torch.device, where: str = "state") -> Any:
    """`saved` with each tensor on the device of the tensor at the same place in `fresh`
    (a freshly initialized state), or on `device` where `fresh` has none. A tensor whose
    shape is not its fresh counterpart's is a ValueError naming its place (a checkpoint of
    another strategy, or of the same one made for another model)."""
    if isinstance(saved, torch.Tensor):
        if not isinstance(fresh, torch.Tensor):
            return saved.to(device)
        if saved.shape != fresh.shape:
            raise ValueError(f"{where} holds a tensor of shape {tuple(saved.shape)} where "
                             f"this run's has {tuple(fresh.shape)}")
        return saved.to(fresh.device)
    if isinstance(saved, dict):
        fresh = fresh if isinstance(fresh, dict) else {}
        return {k: _placed_like(v, fresh.get(k), device, f"{where}[{k!r}]")
                for k, v in saved.items()}
    if isinstance(saved, (list, tuple)):
        fresh = fresh if isinstance(fresh, (list, tuple)) and len(fresh) == len(saved) else ()
        placed = [_placed_like(v, fresh[i] if fresh else None, device, f"{where}[{i}]")
                  for i, v in enumerate(saved)]
        return type(saved)(placed) if isinstance(saved, list) else tuple(placed)
    return saved
