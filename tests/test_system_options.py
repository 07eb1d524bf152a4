"""System options (`--system NAME:KEY=VALUE,...`): parsed, validated with errors that name
the option and what it accepts, canonically named, and reaching the policies they set."""

from __future__ import annotations

import pytest

from marconi.cli import main
from marconi.core.spec import PAPER_7B
from marconi.peers.mamba_radix import BufferMode
from marconi.systems import SYSTEMS, get_system, split_systems

TRACE = "synthetic:multi-turn:sessions=3"


class TestParsing:
    def test_defaults_name_the_base_system(self) -> None:
        assert get_system("sglang-2026:strategy=no_buffer").name == "sglang-2026"
        assert get_system("sglang-2026:strategy=no_buffer") is get_system("sglang-2026:")

    def test_canonical_order_and_values(self) -> None:
        name = "sglang-2026:mamba_full_memory_ratio=0.50,strategy=extra_buffer"
        assert get_system(name).name == \
            "sglang-2026:strategy=extra_buffer,mamba_full_memory_ratio=0.5"

    @pytest.mark.parametrize(("name", "message"), [
        ("sglang-2026:strategy=fast", "strategy='fast' is not allowed (allowed: no_buffer, "
                                      "extra_buffer)"),
        ("sglang-2026:colour=red", "unknown option 'colour' (its options: strategy"),
        ("sglang-2026:strategy", "option 'strategy' needs a value"),
        ("vllm-2026:block_size=0", "block_size='0' is not allowed (allowed: int >= 1 or none)"),
        ("vllm-2026:block_size=x", "block_size='x' is not allowed"),
        ("sglang+:alpha=1", "system sglang+ has no options"),
        ("sglang-2026:eviction=lfu", "eviction='lfu' is not allowed (allowed: lru); the "
                                     "emulation does not model it; sglang-0.5.23 runs"),
    ])
    def test_bad_options_say_what_is_allowed(self, name: str, message: str) -> None:
        with pytest.raises(ValueError) as err:
            get_system(name)
        assert message in str(err.value)

    def test_split_keeps_each_systems_options(self) -> None:
        text = "sglang+,sglang-2026:strategy=extra_buffer,chunked_prefill_size=64,vllm-2026"
        assert split_systems(text) == ["sglang+", "sglang-2026:strategy=extra_buffer,"
                                       "chunked_prefill_size=64", "vllm-2026"]
        assert split_systems("a:k=1;b") == ["a:k=1", "b"]

    def test_every_option_has_a_help_and_a_valid_default(self) -> None:
        for system in SYSTEMS.values():
            for option in system.options:
                assert option.help, (system.name, option.name)
                assert get_system(f"{system.name}:{option.name}="
                                  f"{'none' if option.default is None else option.default}"
                                  ).name == system.name


class TestOptionsReachThePolicies:
    def test_strategy_and_chunk(self) -> None:
        cache = get_system("sglang-2026:strategy=extra_buffer,chunked_prefill_size=512").cache(
            PAPER_7B, "2GB")
        assert cache.admission.config.mode is BufferMode.EXTRA_BUFFER  # type: ignore[attr-defined]
        assert cache.admission.config.chunk == 512  # type: ignore[attr-defined]

    def test_memory_ratio_sizes_the_pool(self) -> None:
        slots = {r: get_system(f"sglang-2026:mamba_full_memory_ratio={r}").layout(
            PAPER_7B, "2GB").state_slots for r in (0.5, 0.9, 2.0)}
        # SGLang's (budget - state) // state, budget = 2e9 r / (1 + r), a state 26,787,840 B
        assert slots == {0.5: 23, 0.9: 34, 2.0: 48}

    def test_block_size_sets_pages_and_blocks(self) -> None:
        system = get_system("vllm-2026:block_size=160")
        assert system.layout(PAPER_7B, "2GB").page_size == 160
        assert system.cache(PAPER_7B, "2GB").admission.block == 160  # type: ignore[attr-defined]

    def test_extra_is_the_strategy_option(self) -> None:
        a, b = (get_system(n).cache(PAPER_7B, "2GB").admission.config  # type: ignore[attr-defined]
                for n in ("sglang-2026-extra", "sglang-2026:strategy=extra_buffer"))
        assert a == b


class TestCommandLine:
    def test_simulate_names_the_configured_system(self, capsys: pytest.CaptureFixture) -> None:
        assert main(["simulate", TRACE, "--system", "sglang-2026:strategy=extra_buffer",
                     "--json", "--quiet", "--no-bounds"]) == 0
        assert '"system": "sglang-2026:strategy=extra_buffer"' in capsys.readouterr().out

    def test_a_bad_option_is_one_line(self, capsys: pytest.CaptureFixture) -> None:
        with pytest.raises(SystemExit) as exit_:
            main(["simulate", TRACE, "--system", "vllm-2026:mamba_cache_mode=all"])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "mamba_cache_mode='all' is not allowed (allowed: align)" in err
        assert "Traceback" not in err

    def test_compare_takes_options(self, capsys: pytest.CaptureFixture) -> None:
        assert main(["compare", TRACE, "--systems", "sglang-2026,sglang-2026:strategy="
                     "extra_buffer,chunked_prefill_size=64", "--json", "--quiet",
                     "--no-bounds"]) == 0
        out = capsys.readouterr().out
        assert '"sglang-2026:strategy=extra_buffer,chunked_prefill_size=64"' in out
