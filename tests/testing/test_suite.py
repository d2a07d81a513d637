"""The conformance suite fails, in one line naming the class and the property, on
strategies and codecs that break it: each check can fail."""

import time

import pytest
import torch

from fastsgd.compress import Identity
from fastsgd.testing import check_codec, check_strategy


class _Base:
    name, OPTIONS, CODEC_KINDS = "broken", {}, ("exact",)  # a plain class: the old flags

    def init(self, params, ctx):
        return {}

    def on_gradients(self, params, state, ctx):
        ctx.transport.all_reduce(torch.cat([p.grad.reshape(-1) for p in params]))

    def on_parameters(self, params, state, ctx):
        return None

    def close(self):
        return None


class WallClockNoise(_Base):
    """Perturbs the parameters by noise seeded from the wall clock."""

    def on_parameters(self, params, state, ctx):
        generator = torch.Generator().manual_seed(time.perf_counter_ns())
        with torch.no_grad():
            for p in params:
                p.add_(1e-3 * torch.randn(p.shape, generator=generator))


class ForgetsItsCount(_Base):
    """Averages on every fifth call it has seen, a count it keeps outside its state."""

    def __init__(self):
        self.calls = 0

    def on_parameters(self, params, state, ctx):
        self.calls += 1
        if self.calls % 5 == 1:
            with torch.no_grad():
                for p in params:
                    ctx.transport.all_reduce(p.data, average=True)


class LeavesMail(_Base):
    """Posts a message to its neighbour every step and never reads it."""

    CHECKPOINTS = False  # the simulator cannot checkpoint messages in flight

    def init(self, params, ctx):
        ctx.transport.start_messages()
        return {}

    def on_parameters(self, params, state, ctx):
        t = ctx.transport
        t.post(torch.zeros(1), (t.rank + 1) % t.world_size, 7)


class WrongShape(Identity):
    """Decodes to a flat vector, whatever shape it was given."""

    def decode(self, payload, like):
        return payload["values"].reshape(-1)


@pytest.mark.parametrize("cls,prop", [(WallClockNoise, "determinism"),
                                      (ForgetsItsCount, "resume"), (LeavesMail, "drain")])
def test_each_broken_strategy_fails_its_property_in_one_line(cls, prop, tmp_path):
    with pytest.raises(AssertionError) as caught:
        check_strategy(cls, out=tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"strategy 'tests.testing.test_suite:{cls.__name__}' with codec "
                              f"'none' fails '{prop}': ")


def test_a_codec_that_decodes_to_another_shape_fails_its_contract():
    with pytest.raises(AssertionError, match=r"^codec 'tests.testing.test_suite:WrongShape' "
                                             r"fails 'contract': decode gave torch.float32 "
                                             r"\(1088,\) for torch.float32 \(64, 17\)$"):
        check_codec(WrongShape)


def test_options_are_checked_as_the_config_checks_them():
    with pytest.raises(Exception, match="unknown config key 'strategy.periode'"):
        check_strategy("localsgd", periode=4)


@pytest.mark.multiproc
def test_an_asynchronous_strategy_is_not_real_equals_simulated(tmp_path):
    with pytest.raises(AssertionError, match="^strategy 'hogwild' with codec 'none' fails "
                                             "'real equals simulated': real processes end"):
        check_strategy("hogwild", real=True, out=tmp_path)
