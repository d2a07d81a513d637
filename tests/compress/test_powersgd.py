"""PowerSGD factors a layer's gradient in the layer's own shape (Vogels et al. 2019, Section
3), where it is low-rank, and sends whole what the factors would not shrink."""

import torch

from fastsgd.compress import build_compressor
from fastsgd.compress.collectives import init_all_reduce
from tests.compress.helpers import OneWorker


def linear_gradient(samples: int) -> torch.Tensor:
    """The weight gradient of a Linear(32, 16) for a batch: rank <= samples."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(32, 16)
    layer(torch.randn(samples, 32)).square().sum().backward()
    return layer.weight.grad


def test_a_layers_gradient_of_rank_below_the_codecs_is_sent_exactly():
    grad = linear_gradient(samples=4)  # rank 4 < 8
    codec = build_compressor({"name": "powersgd"})
    state = init_all_reduce(codec, torch.zeros_like(grad), 1)
    assert state["q"].shape == (32, 8)  # the (out, in) matrix's columns
    out = codec.all_reduce(grad.reshape(-1), state, OneWorker())  # buckets are flat
    assert torch.allclose(out, grad.reshape(-1), rtol=0, atol=1e-5 * grad.abs().max())


def test_the_same_gradient_viewed_flat_is_not():
    """What the layer's shape buys: a near-square view of the same numbers (23 x 23, padded)
    mixes rows of the layer, and rank 8 leaves a large part behind."""
    grad = linear_gradient(samples=4)
    codec = build_compressor({"name": "powersgd"})
    state = codec.init(grad.reshape(-1))
    assert state["q"].shape == (23, 8)
    out = codec.all_reduce(grad.reshape(-1), state, OneWorker())
    assert (out - grad.reshape(-1)).norm() > 0.1 * grad.norm()


def test_what_the_factors_would_not_shrink_is_sent_whole():
    codec = build_compressor({"name": "powersgd"})
    for like in [torch.zeros(16), torch.zeros(6, 1, 5, 5)]:  # a bias; LeNet's first conv
        state = init_all_reduce(codec, like, 1)
        assert state == {}  # no factor, no residual
        x = torch.randn(like.shape)
        assert torch.equal(codec.all_reduce(x.reshape(-1), state, OneWorker()), x.reshape(-1))


def test_a_layer_is_factored_whole_over_its_trailing_dimensions():
    codec = build_compressor({"name": "powersgd", "rank": 4})
    state = init_all_reduce(codec, torch.zeros(16, 6, 5, 5), 1)  # LeNet's second conv
    assert state["q"].shape == (150, 4) and state["residual"].shape == (2400,)
