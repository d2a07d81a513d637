"""Real processes and the simulator train the same model (issue 51, item 1): every
synchronous built-in strategy with every codec it carries, on 4 workers, ends with the same
parameters to 1e-5 and the same bytes. A strategy or codec added to the registries is in
the loop the day it lands; REAL_EQUALS_SIMULATED (test_builtins.py) says which strategies
are synchronous."""

import pytest

from fastsgd.compress import CODECS
from fastsgd.strategies import STRATEGIES, capabilities_of
from fastsgd.testing import checks
from fastsgd.testing.tiny import TinyJob, subject
from tests.conformance.test_builtins import REAL_EQUALS_SIMULATED


def _pairs() -> list[tuple[str, str]]:
    pairs = []
    for strategy in sorted(REAL_EQUALS_SIMULATED):
        caps = capabilities_of(STRATEGIES.get(strategy)())
        pairs += [(strategy, codec) for codec in sorted(CODECS)
                  if CODECS.get(codec).kind in caps.codec_kinds
                  and codec not in caps.refused_codecs]
    return pairs


def test_every_synchronous_strategy_carries_a_lossy_codec():
    carried = {s for s, c in _pairs() if c != "none"}
    assert carried >= {"allreduce", "localsgd", "diloco", "bmuf", "easgd", "dpsgd"}


@pytest.mark.multiproc
@pytest.mark.parametrize("strategy,codec", _pairs())
def test_real_processes_equal_the_simulator(strategy, codec, tmp_path):
    job = TinyJob(subject("strategy", strategy, {}), subject("codec", codec, {}), workers=4,
                  steps=8, folder=tmp_path)
    checks.real_equals_simulated(job, tolerance=1e-5)
