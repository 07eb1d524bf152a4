"""Least frequently used, as SGLang's `--radix-eviction-policy lfu` orders its radix
tree: leaves by hit count (the commits that passed through the node), then least
recently used first (docs/peers.md, "Other baselines"). Declared as a `Priority`; any
evaluator of declarations runs it (`marconi.core.ranked.Ranked` on the Python core)."""

from __future__ import annotations

from marconi.core.priority import Feature, Key, Priority, Term

LFU = Priority("lfu", keys=(Key(Term(Feature.HITS)), Key(Term(Feature.RECENCY))),
               description="leaves by hit count, then least recently used")
