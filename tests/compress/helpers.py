"""What the codec tests share: a model-sized gradient and its bytes."""

import torch

MODEL = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
NUMEL = sum(p.numel() for p in MODEL.parameters())  # 101,770 parameters
FP32 = 4 * NUMEL  # its bytes


def gradient(seed: int = 0, numel: int = NUMEL) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(seed))


class OneWorker:
    """A transport of one worker, for PowerSGD's all-reduces: the sum of one is itself."""
    world_size = 1

    def all_reduce(self, tensor, async_op=False):
        return None
