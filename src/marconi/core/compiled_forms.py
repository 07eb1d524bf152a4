"""What the compiled core runs (docs/architecture.md, "The compiled core"): the names a
policy's class declares (`compiled_as`), how a declared score maps onto its evaluator
(`score_form`), and why a pair of policies with a layout does not run there
(`compiled_reason`). `marconi.core.compiled` builds the cache from these."""

from __future__ import annotations

from marconi.core.layout import Layout
from marconi.core.policy import Admission, Eviction
from marconi.core.priority import Feature, Score
from marconi.core.scores import OVER_A_LIST
from marconi.core.spec import ModelSpec

# what the compiled core runs, by `compiled_as`
ADMISSIONS = ("placed", "structured", "sparse", "align", "radix")
EVICTIONS = ("ranked", "scored", "keep",
             "switchable", "blocklru", "blockflop", "radixlru", "radixflop", "radixtlru")
# vLLM's align mode runs with its block queue (and it alone), KV in pages or per token;
# SGLang's admission with its two lists (and they alone), a state pool or not; either may
# run with `keep` (the unbounded cache of the bounds, which never evicts)
BLOCK_QUEUES = ("blocklru", "blockflop")
RADIX_LISTS = ("radixlru", "radixflop", "radixtlru")
# an engine's admission -> the evictions it runs compiled with, in words
ENGINE_PAIRS = {"align": (BLOCK_QUEUES, "vLLM's align mode", "its block queue"),
                "radix": (RADIX_LISTS, "SGLang's admission", "its two lists")}


def compiled_as(policy: Admission | Eviction) -> str | None:
    """The compiled core's name for `policy`, which its own class declares
    (`compiled_as`) where the compiled core runs it exactly; None otherwise. Inherited
    declarations do not count: a subclass may change what its parent did."""
    if "compiled_as" not in vars(type(policy)):
        return None
    return getattr(policy, "compiled_as", None)


# the features the compiled core computes for a declared score, by their code there
# (`Core::ScoreFeature`)
SCORE_FEATURES = (Feature.RECENCY, Feature.INVERSE_AGE, Feature.EFFICIENCY, Feature.REPLAY,
                  Feature.LEVEL, Feature.DENSITY)


def score_form(score: Score, ranked: bool
               ) -> tuple[list[int], list[float], list[bool], bool, bool] | str:
    """How the compiled core evaluates a declared `Score`: per term its feature's code
    (`SCORE_FEATURES`), its weight and whether alpha multiplies it, whether the terms are
    normalized and whether multiplied (`Core::set_score_terms`, any terms over those
    features, `DENSITY` learned from the books `set_density` hands it; over an engine's
    state list, `ranked`, recency and efficiency only: `OVER_A_LIST`). Or why it cannot."""
    python = f"score {score.name!r} runs in Python only: the compiled core evaluates"
    have = [f for f in SCORE_FEATURES if not ranked or f in OVER_A_LIST]
    where = " over an engine's state list" if ranked else ""
    for term in score.terms:
        if term.feature not in have:
            return (f"{python} {', '.join(f.value for f in have)}{where}, not "
                    f"{term.feature.value}")
    return ([SCORE_FEATURES.index(t.feature) for t in score.terms],
            [t.weight for t in score.terms], [t.tuned for t in score.terms], score.normalized,
            score.product)


def compiled_reason(spec: ModelSpec, admission: Admission, eviction: Eviction,
                    layout: Layout) -> str | None:
    """Why these policies cannot run on the compiled core; None when they can."""
    if compiled_as(admission) not in ADMISSIONS:
        return f"admission {type(admission).__name__} runs in Python only"
    if compiled_as(eviction) not in EVICTIONS:
        return f"eviction {type(eviction).__name__} runs in Python only (as configured)"
    books = eviction.core_books()
    if books.keys is not None and len(books.keys.keys) > 2:
        return "a declared priority of more than two keys runs in Python only"
    state_score = books.state_score.score if books.state_score is not None else None
    for score, ranked in ((books.score, False), (state_score, True),
                          *((s, False) for s in books.learned)):
        form = score_form(score, ranked) if score is not None else None
        if isinstance(form, str):
            return form
    if compiled_as(admission) == "structured" and spec.ssm_layers == 0:
        return ("Structured admission of a model without SSM layers (a node per block) runs "
                "in Python only")
    for kind, (evictions, who, lists) in ENGINE_PAIRS.items():
        mine = compiled_as(admission) == kind
        if mine != (compiled_as(eviction) in evictions) and compiled_as(eviction) != "keep":
            return (f"{type(admission).__name__} with {type(eviction).__name__} runs in "
                    f"Python only ({who} is compiled with {lists} only)")
        if mine and spec.ssm_layers == 0:
            return f"{who} for a model without SSM layers runs in Python only"
    aligned, radix = compiled_as(admission) == "align", compiled_as(admission) == "radix"
    if radix and books.cap_per_path is not None:
        return "SGLang's cap on states per path runs in Python only"
    if (layout.pooled and not radix) or (layout.page_size > 1 and not aligned):
        return (f"layout {layout.describe()} runs in Python only (compiled: one byte "
                "budget, KV pages under vLLM's align mode, a state pool under SGLang's)")
    if max(spec.kv_bytes_per_token, spec.ssm_bytes) >= 2**40:
        return "model byte sizes beyond the compiled core's integer range"
    return None
