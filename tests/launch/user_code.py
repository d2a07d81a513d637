"""A user's code that raises, named by import path in the tests of how a worker's failure is
told (test_user_errors.py, tests/bench/test_bench_errors.py)."""

import torch


def raises(model, batch):
    raise ValueError("oops in user step")


class Boom(torch.nn.Module):
    def __init__(self):
        raise ValueError("oops in model")
