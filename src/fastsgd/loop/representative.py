"""Which model a run keeps and evaluates when replicas differ (Viviani et al. 2019, §III:
"the policy to determine which model to choose as representative when the training ends").

- `average`: the mean of all replicas' parameters (and floating-point buffers);
- `best`: the replica with the lowest loss (the user's own step) on a fixed sample of the
  training data, the same for every worker, so no test data is used to choose;
- `rank0`: worker 0's replica.

Every worker calls `representative` (it is collective); all get the same model back.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from fastsgd.strategies.params import assign, average
from fastsgd.transport.base import Transport

POLICIES = ("average", "best", "rank0")
Score = Callable[[torch.nn.Module], float]


def representative(policy: str, model: torch.nn.Module, transport: Transport,
                   score: Score) -> torch.nn.Module:
    if policy == "rank0" or transport.world_size == 1:
        return model
    chosen = copy.deepcopy(model)
    params = list(chosen.parameters())
    if policy == "average":
        assign(params, average(list(model.parameters()), transport))
        for buffer in chosen.buffers():
            if buffer.is_floating_point():
                transport.all_reduce(buffer, average=True)
        return chosen
    # each score with its rank: once workers are lost, the parts are those of the living
    scores = transport.all_gather(torch.tensor([score(model), transport.rank],
                                               dtype=torch.float64, device=transport.device))
    best = min((float(s[0]), int(s[1])) for s in scores)[1]
    with torch.no_grad():
        for t in [*params, *chosen.buffers()]:
            transport.broadcast(t.data, src=best)
    return chosen
