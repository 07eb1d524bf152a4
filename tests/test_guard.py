"""The bootstrap tuner's guard in the engines' plugins (marconi.engines.integrations.choosers,
`Bootstrap`): beside its mirror a second one at alpha 0, the engine's own order, fed the
same requests; once the tuner has adopted another alpha, alpha 0 is restored (once) when
its mirror leads the adopted alpha's by more than the bound since the adoption, and only
then. Real traces through the vLLM mirror, inline, in the tuner's thread and in its own
process."""

from __future__ import annotations

import logging

import pytest

from marconi.core.spec import PAPER_7B
from marconi.core.tuning import DECIDE_EVERY, DECISIVE_LEAD, Objective, hit_worth
from marconi.core.units import parse_size
from marconi.engines.integrations.choosers import Bootstrap
from marconi.engines.integrations.common import Counters, Tuning
from marconi.systems import get_system
from marconi.workload import TraceOptions, load_trace

# multi-turn sessions through vLLM's mirror with 64-token blocks: at 700 MB the tuner adopts
# alpha 1.1 after 54 requests and alpha 0 then saves more; at 1.5 GB with 16-token blocks
# it adopts 1.7, which saves more than alpha 0 to the end
LOSES = ("vllm-2026+marconi:block_size=64,retention_interval=none", "700MB")
WINS = ("vllm-2026+marconi:block_size=16,retention_interval=none", "1500MB")


class _Order:
    alpha = 0.0


def _trace() -> list:
    return list(load_trace("synthetic:multi-turn", options=TraceOptions(sessions=40)))


def _tuned(where: tuple[str, str], *, background: bool = False, process: bool = False,
           guard: bool = True, log: logging.Logger | None = None
           ) -> tuple[Tuning, _Order, list[float | None]]:
    """The trace fed to a bootstrap tuner over the mirror `where` (system, capacity): the
    tuning, the engine's order, and the alpha the order ran after each request (inline)."""
    order = _Order()
    tuning = Tuning(order, PAPER_7B, Counters(), background=background, process=process,
                    chooser=Bootstrap(guard=guard), log=log)
    tuning.start(where[0], parse_size(where[1]))
    if background and not process:  # its replays waited for, as inline: the same requests
        tuning.chooser.tuner.wait = True  # type: ignore[attr-defined]
    alphas = []
    for r in _trace():
        tuning.counters.requests += 1
        tuning.feed(r.tokens(), r.n_input)
        alphas.append(order.alpha)
    tuning.close(timeout=300)
    return tuning, order, alphas


def _alpha0_saved(where: tuple[str, str], start: int, end: int) -> tuple[float, float]:
    """What a fresh mirror at alpha 0 saves over requests [start, end) of the trace, and
    what a cache holding every input would have (prefill FLOPs)."""
    cache = get_system(where[0]).cache(PAPER_7B, parse_size(where[1]), alpha=0.0)
    saved = possible = 0.0
    for i, r in enumerate(_trace()[:end]):
        worth = hit_worth(cache, r.tokens(), r.n_input, (), Objective.FLOPS)
        if i >= start:
            saved += worth
            possible += PAPER_7B.flops(r.n_input)
    return saved, possible


def test_the_bound_is_marconi_plus_lead_against_the_engines_order() -> None:
    from marconi.plus.shadows import ShadowConfig

    config, guard = ShadowConfig(), Bootstrap()
    assert (config.every, config.lead) == (guard.every, guard.lead) \
        == (DECIDE_EVERY, DECISIVE_LEAD)


def test_alpha_zero_is_restored_once_when_the_adopted_alpha_saves_less(
        caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("test.marconi.guard")
    with caplog.at_level(logging.INFO, logger=log.name):
        tuning, order, alphas = _tuned(LOSES, log=log)
    guard = tuning.report()["guard"]
    adopted, at, restored = guard["adopted"], guard["adopted_at"], guard["restored_at"]
    assert adopted > 0 and at is not None and restored is not None and restored > at
    # the adopted alpha ran from its request to the guard's, alpha 0 before and after
    assert alphas[at - 1] == adopted and alphas[restored - 2] == adopted
    assert alphas[restored - 1] == order.alpha == 0.0 and alphas[-1] == 0.0
    assert set(alphas[:at - 1]) == {0.0} and set(alphas[restored - 1:]) == {0.0}
    assert tuning.status() == "tuned" and guard["restored"]
    # decided at a decision point, on the books since the adoption only: alpha 0's there
    # is a fresh alpha-0 mirror's over those requests
    since = restored - at
    assert guard["since"] == since and since % DECIDE_EVERY == 0
    saved0, possible = _alpha0_saved(LOSES, at, restored)
    assert guard["saved_alpha0"] == pytest.approx(saved0, rel=1e-12)
    assert guard["possible"] == pytest.approx(possible, rel=1e-12)
    lead = guard["saved_alpha0"] - guard["saved_adopted"]
    assert lead > max(DECISIVE_LEAD * possible, possible / since)
    # the log says why
    said = [m for m in caplog.messages if "alpha 0 adopted" in m]
    assert len(said) == 1 and f"was {adopted:g}" in said[0] and "its guard" in said[0]
    assert "alpha 0 (the engine's own order) saved" in said[0]
    assert "alpha_why" in tuning.report()


def test_alpha_zero_is_not_restored_while_the_adopted_alpha_saves_more() -> None:
    tuning, order, alphas = _tuned(WINS)
    guard = tuning.report()["guard"]
    assert guard["adopted"] > 0 and guard["restored_at"] is None and not guard["restored"]
    assert order.alpha == guard["adopted"] and alphas[-1] == guard["adopted"]
    assert guard["since"] == len(alphas) - guard["adopted_at"]  # guarded to the end
    assert guard["saved_adopted"] > guard["saved_alpha0"] > 0
    assert "alpha_why" not in tuning.report()


def test_without_the_guard_the_tuner_chooses_as_before() -> None:
    """The guard changes nothing until it restores alpha 0: the tuner adopts the same
    alpha after the same request with it or without it."""
    with_guard, _, alphas = _tuned(LOSES)
    without, order, alphas_without = _tuned(LOSES, guard=False)
    at = with_guard.report()["guard"]["restored_at"]
    assert alphas[:at - 1] == alphas_without[:at - 1]
    assert order.alpha == with_guard.report()["guard"]["adopted"] > 0
    assert without.report()["guard"]["since"] == 0  # no books kept


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_in_its_thread_and_its_process_the_guard_restores_as_inline(
        mode: str, caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("test.marconi.guard")
    inline, inline_order, _ = _tuned(LOSES)
    with caplog.at_level(logging.INFO, logger=log.name):
        other, order, _ = _tuned(LOSES, background=True, process=mode == "process", log=log)
    if mode == "process":
        assert other.remote is not None and other.remote.dead == "closed"
    else:
        assert other.remote is None and other.threads
    assert order.alpha == inline_order.alpha == 0.0
    assert other.report()["guard"] == inline.report()["guard"]
    assert other.report()["alpha_why"] == inline.report()["alpha_why"]
    said = [m for m in caplog.messages if "alpha 0 adopted" in m]
    assert len(said) == 1 and "its guard" in said[0]


def test_a_bad_guard_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="every must be >= 1"):
        Bootstrap(every=0)
    with pytest.raises(ValueError, match="lead in"):
        Bootstrap(lead=1.5)
