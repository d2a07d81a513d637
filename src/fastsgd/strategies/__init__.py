"""Global training strategies, chosen by `[strategy] name` (one file per family)."""

from __future__ import annotations

from fastsgd.compress import CODECS
from fastsgd.config.options import Registry
from fastsgd.strategies.allreduce import AllReduce
from fastsgd.strategies.async_gossip import SGP
from fastsgd.strategies.averaging import BMUF, EASGD, LocalSGD
from fastsgd.strategies.base import Context, Strategy, StrategyBase
from fastsgd.strategies.capabilities import Capabilities, capabilities_of, hook
from fastsgd.strategies.contract import check_strategy, check_strategy_class
from fastsgd.strategies.ddp import DDP
from fastsgd.strategies.diloco import DiLoCo
from fastsgd.strategies.gossip import DPSGD
from fastsgd.strategies.hogwild import Hogwild
from fastsgd.strategies.lowcomm.async_diloco import AsyncDiLoCo
from fastsgd.strategies.lowcomm.demo import DeMo
from fastsgd.strategies.lowcomm.noloco import NoLoCo
from fastsgd.strategies.lowcomm.sparseloco import SparseLoCo
from fastsgd.strategies.lowcomm.sparta import Sparta
from fastsgd.strategies.pairwise import ADPSGD
from fastsgd.strategies.ps import ParameterServer
from fastsgd.strategies.ssp import StaleSynchronous
from fastsgd.strategies.tournament import Tournament

STRATEGIES = Registry("strategy", "strategy", {
    cls.name: cls for cls in (AllReduce, StaleSynchronous, LocalSGD, EASGD, BMUF, DPSGD, ADPSGD,
                              SGP, ParameterServer, Hogwild, Tournament, DiLoCo, AsyncDiLoCo,
                              SparseLoCo, DeMo, Sparta, NoLoCo, DDP)},
    contract=check_strategy_class)
validate_options = STRATEGIES.validate
build_strategy = STRATEGIES.build
# What the config's open sections choose from (fastsgd.config.schema takes it as an argument).
CHOICES = {"strategy": STRATEGIES, "compression": CODECS}

__all__ = ["ADPSGD", "BMUF", "CHOICES", "DDP", "DPSGD", "EASGD", "SGP", "STRATEGIES", "AllReduce",
           "AsyncDiLoCo", "Capabilities", "Context", "DeMo", "DiLoCo", "Hogwild", "LocalSGD",
           "NoLoCo", "ParameterServer", "SparseLoCo", "Sparta", "StaleSynchronous", "Strategy",
           "StrategyBase", "Tournament", "build_strategy",
           "capabilities_of", "check_strategy", "check_strategy_class", "hook",
           "validate_options"]
