"""Every built-in strategy (with the identity codec) and every built-in codec (carried by
allreduce) passes the conformance suite (fastsgd.testing). Real processes equal the
simulator for the strategies and codecs whose arithmetic does not depend on timing or on
a process-wide random stream."""

import pytest

from fastsgd.compress import CODECS
from fastsgd.strategies import STRATEGIES, capabilities_of
from fastsgd.testing import check_codec, check_strategy

# asynchronous (ps, hogwild, adpsgd, sgp; async_diloco past staleness 0): what a worker gets
# depends on when it arrives;
# ddp: real processes only (its suite: a real run that ends cleanly)
REAL_EQUALS_SIMULATED = {"allreduce", "bmuf", "demo", "diloco", "dpsgd", "easgd", "localsgd",
                         "ltfb", "noloco", "sparseloco", "sparta", "ssp"}
# every codec, those that draw random numbers too: a simulated worker draws from its own
# stream, as a process does (transport/sim/scheduler.py)
CODECS_REAL_EQUALS_SIMULATED = set(CODECS)


def _cases(names, real):
    return [pytest.param(n, marks=pytest.mark.multiproc) if n in real or n == "ddp"
            else n for n in names]


@pytest.mark.parametrize("name", _cases(STRATEGIES, REAL_EQUALS_SIMULATED))
def test_strategy_conforms(name, tmp_path):
    ran = check_strategy(name, real=name in REAL_EQUALS_SIMULATED, out=tmp_path)
    if capabilities_of(STRATEGIES.get(name)).real_only:
        assert ran == ["ends cleanly (real processes)"]
    else:
        assert {"determinism", "resume", "drain"} <= set(ran)


@pytest.mark.parametrize("name", _cases(CODECS, CODECS_REAL_EQUALS_SIMULATED))
def test_codec_conforms_with_allreduce(name, tmp_path):
    ran = check_codec(name, real=name in CODECS_REAL_EQUALS_SIMULATED, out=tmp_path)
    assert ran[:4] == ["contract", "determinism", "resume", "drain"]
