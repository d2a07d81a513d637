"""Conformance checks for your own strategy or codec (`fastsgd.testing`).

    from fastsgd.testing import check_strategy, check_codec
    check_strategy("my_strategy:Sparta", fraction=0.1)
    check_codec("my_codec:TwoBit")

Each check trains a tiny job (an MLP on the 8x8 `digits`, 2 workers, 24 steps) and raises
AssertionError in one line naming the class and the property it breaks: determinism in the
simulator, a bitwise resume from a checkpoint halfway, draining at the end, and (asked
for with `real=True`) real processes equal to the simulator. They sit in a test as they are:

    def test_my_strategy():
        check_strategy(Sparta, real=True)
"""

from fastsgd.testing.suite import check_codec, check_strategy

__all__ = ["check_codec", "check_strategy"]
