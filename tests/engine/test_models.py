"""The tiny test models keep their state: in every family a wrong restored state moves the
next-token logits far beyond the exactness tolerance, while a right one matches an
uncached forward to float32 rounding (`models.make_state_matter`, docs/architecture.md,
"Modules"). Without this, a cache that restored no recurrent state at all passed the
logit checks: transformers' random initialization forgets a state within a few tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tests.engine.reference import TOL

from marconi.core.families import ENGINE_FAMILIES
from marconi.engines.hf import HybridModel, SSMState, restore, snapshot_kv
from marconi.engines.hf.prefill import forward, prefill

FAMILIES = sorted(ENGINE_FAMILIES)
SENSITIVE = 1e-2  # the least a zeroed state must move the next-token logits
PREFIX, NEXT = 30, 10


def _zeroed(state: SSMState, part: str) -> SSMState:
    conv = tuple(torch.zeros_like(t) if part == "conv" else t for t in state.conv)
    recurrent = tuple(torch.zeros_like(t) if part == "recurrent" else t for t in state.recurrent)
    return SSMState(state.position, conv, recurrent, state.logits)


def _continue(model: HybridModel, seed: int, part: str | None) -> tuple[torch.Tensor, float]:
    """Logits of the token after a restored 30-token prefix (its state zeroed in `part`),
    and how far 10 tokens continued from the intact state are from an uncached forward."""
    tokens = torch.from_numpy(np.random.default_rng(seed).integers(0, 256, PREFIX + NEXT)).long()
    done = prefill(model, tokens[:PREFIX], model.new_cache(), 0, [PREFIX])
    state, kv = done.states[PREFIX], snapshot_kv(model, done.cache, 0, PREFIX)
    used = state if part is None else _zeroed(state, part)
    first = forward(model, restore(model, kv, used), tokens[PREFIX : PREFIX + 1], PREFIX)
    cached = forward(model, restore(model, kv, state), tokens[PREFIX:], PREFIX)
    full = forward(model, model.new_cache(), tokens, 0)
    return first, float((cached - full).abs().max())


@pytest.mark.parametrize("arch", FAMILIES)
@pytest.mark.parametrize("part", ["recurrent", "conv"])
def test_a_zeroed_state_moves_the_logits_in_every_family(get_model, arch, part):
    model = get_model(arch)
    for seed in range(3):
        right, exact = _continue(model, seed, None)
        wrong, _ = _continue(model, seed, part)
        moved = float((wrong - right).abs().max())
        assert moved >= SENSITIVE, f"{arch}: a zeroed {part} state moves the logits by {moved:.1e}"
        assert exact <= 1e-6 < TOL, f"{arch}: cached vs uncached differ by {exact:.1e}"


def test_every_family_has_its_mixers_adjusted(get_model):
    from marconi.engines.hf.models import PROJECTION_GAIN, SLOW_A_LOG

    for arch in FAMILIES:
        mixers = [m for m in get_model(arch).module.modules()
                  if isinstance(getattr(m, "A_log", None), torch.nn.Parameter)]
        assert mixers, arch
        for mixer in mixers:
            assert torch.all(mixer.A_log == SLOW_A_LOG), arch
            if isinstance(getattr(mixer, "D", None), torch.nn.Parameter):
                assert torch.all(mixer.D == 0), arch
    assert PROJECTION_GAIN > 1


def test_the_reference_kernel_notice_is_said_once_in_our_words():
    """transformers says it per kernel function (four lines for a Mamba2 model, two more
    for Qwen3-Next); the engine says it once (its own process: transformers says each
    only once per process)."""
    import subprocess
    import sys

    from marconi.engines.hf._kernels import FALLBACK, NOTICE

    script = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stderr)\n"
        "import numpy as np\n"
        "from marconi.engines.hf import Engine, tiny_model\n"
        "for arch in ('bamba', 'qwen3_next'):\n"
        "    Engine(tiny_model(arch), 'marconi').generate(np.arange(20) % 200, 3)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, check=True)
    assert FALLBACK not in done.stderr, done.stderr
    assert done.stderr.count(NOTICE) == 1, done.stderr
