"""The core: radix tree, `PrefixCache`, its books, the cost model and the policy protocols.

Everything above it (policy families, named systems, simulator, engine, server) imports
it; it imports nothing of marconi outside itself (a test asserts this).
"""

from __future__ import annotations

from marconi.core.cache import CommitResult, Plan, PrefixCache
from marconi.core.integrity import check_integrity
from marconi.core.policy import Action, Admission, Eviction, Pressure, Victim
from marconi.core.spec import PAPER_7B, ModelSpec, resolve_model
from marconi.core.state_store import Freed, NullStore, StateStore
from marconi.core.stats import CacheStats
from marconi.core.tokens import Tokens, as_tokens
from marconi.core.tree import Match, Node, RadixTree
from marconi.core.tuning import Objective, Tuner, TuningReport

__all__ = [
    "PAPER_7B",
    "Action",
    "Admission",
    "CacheStats",
    "CommitResult",
    "Eviction",
    "Freed",
    "Match",
    "ModelSpec",
    "Node",
    "NullStore",
    "Objective",
    "Plan",
    "PrefixCache",
    "Pressure",
    "RadixTree",
    "StateStore",
    "Tokens",
    "Tuner",
    "TuningReport",
    "Victim",
    "as_tokens",
    "check_integrity",
    "resolve_model",
]
