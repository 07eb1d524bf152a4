"""The paper's systems (vanilla, vllm+, sglang+, marconi and its artifact-recency twin)
and Marconi's bootstrap tuner."""

from __future__ import annotations

from dataclasses import replace

from marconi.core.spec import ModelSpec
from marconi.core.tuning import Tuner
from marconi.systems.registry import Policies, TunerOptions, system


def bootstrap(options: TunerOptions) -> Tuner:
    """Marconi's bootstrap alpha tuner."""
    from marconi.paper.tuner import bootstrap_tuner

    return bootstrap_tuner(options.settings, executor=options.executor, wait=options.wait,
                           serving=options.serving)  # type: ignore[arg-type]


def bootstrap_once(options: TunerOptions) -> Tuner:
    """Marconi's bootstrap tuner as marconi's engine plugins run it: one window, never
    re-tuned (their chooser, `integrations.choosers.Bootstrap`, asks for that)."""
    return bootstrap(replace(options, settings={**options.settings, "retune": False}))


# --- the paper's systems --------------------------------------------------------------------


@system("vanilla", "no prefix caching")
def _vanilla(spec: ModelSpec, alpha: float) -> Policies:
    from marconi.paper.admission import NoAdmission
    from marconi.paper.eviction import LRULeaf

    return NoAdmission(), LRULeaf()


@system("vllm+", "paper baseline: a checkpoint every 32-token block, LRU over blocks")
def _vllm_plus(spec: ModelSpec, alpha: float) -> Policies:
    from marconi.paper.admission import Block
    from marconi.paper.eviction import LRULeaf

    return Block(32), LRULeaf(deepest_first=True)


@system("sglang+", "paper baseline: judicious admission, LRU over leaves")
def _sglang_plus(spec: ModelSpec, alpha: float) -> Policies:
    from marconi.paper.admission import Judicious
    from marconi.paper.eviction import LRULeaf

    return Judicious(), LRULeaf()


@system("marconi", "the paper: judicious admission, FLOP-aware eviction, bootstrap alpha",
        tuner=bootstrap, uses_alpha=True)
def _marconi(spec: ModelSpec, alpha: float) -> Policies:
    from marconi.paper.admission import Judicious
    from marconi.paper.eviction import FlopAware

    return Judicious(), FlopAware(spec, alpha)


@system("marconi-inverse-age", "marconi with the artifact's recency 1/(now - t + 1)",
        tuner=bootstrap, uses_alpha=True)
def _marconi_inverse_age(spec: ModelSpec, alpha: float) -> Policies:
    from marconi.paper.admission import Judicious
    from marconi.paper.eviction import FlopAware, Recency

    return Judicious(), FlopAware(spec, alpha, Recency.INVERSE_AGE)
