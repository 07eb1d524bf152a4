"""The server's parts without HTTP: codec, detokenizer, config, CLI, the engine hook."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from marconi.commands.serve import config_from_args, register
from marconi.engine import Engine, HybridModel
from marconi.server.chat import Detokenizer, EmbeddedCodec, Message
from marconi.server.config import EMBEDDED_MODEL, ServerConfig


@pytest.fixture(scope="module")
def codec() -> EmbeddedCodec:
    return EmbeddedCodec(memo_size=2)


class TestEmbeddedCodec:
    def test_a_conversation_only_grows_at_the_end(self, codec: EmbeddedCodec) -> None:
        one = [Message("system", "Be brief."), Message("user", "Hello there")]
        two = [*one, Message("assistant", "Hi."), Message("user", "Bye")]
        first, second = codec.render_chat(one), codec.render_chat(two)
        marker = codec.render_chat([])[1:]  # the generation prompt after BOS
        assert first[0] == codec.bos_id and first[-len(marker):] == marker
        assert second[: len(first)] == first  # prefix stable, turn by turn

    def test_render_marks_where_each_message_ends(self, codec: EmbeddedCodec) -> None:
        messages = [Message("system", "Be brief."), Message("user", "Hello there")]
        tokens, ends = codec.render(messages)
        assert tokens == codec.render_chat(messages) and len(ends) == 2
        assert 0 < ends[0] < ends[1] < len(tokens)
        alone, alone_ends = codec.render(messages[:1])
        assert alone_ends == ends[:1] and tokens[: ends[0]] == alone[: ends[0]]

    def test_replies_come_back_as_the_tokens_generated(self, codec: EmbeddedCodec) -> None:
        tokens = [9000, 17, 30000, 2]
        text = codec.decode(tokens)
        codec.remember(text, tokens)
        rendered = codec.render_chat([Message("assistant", text)])
        assert rendered[1:-len(codec.render_chat([])[1:])][-len(tokens):] == tokens
        codec.remember("a", [5])
        codec.remember("b", [6])  # memo bounded at 2: `text` is forgotten
        assert codec.render_chat([Message("assistant", text)]) != rendered

    def test_unknown_role(self) -> None:
        with pytest.raises(ValueError, match="role"):
            Message("robot", "x")


class TestDetokenizer:
    def test_deltas_concatenate_to_the_whole_text(self, codec: EmbeddedCodec) -> None:
        tokens = [int(t) for t in np.random.default_rng(0).integers(3, 32000, 200)]
        tokens += [130, 131, 132]  # byte-fallback pieces that may form partial characters
        detok = Detokenizer(codec, frozenset({2}))
        deltas = [detok.push(t) for t in [*tokens, 2]] + [detok.flush()]
        assert "".join(deltas) == detok.text == codec.decode(tokens)


class TestConfig:
    @pytest.mark.parametrize(("field", "value", "match"), [
        ("system", "nope", "unknown system"), ("cache_size", "lots", "bad size"),
        ("alpha", -1.0, "alpha"), ("port", 70000, "port"), ("max_queue", 0, "queue"),
        ("max_tokens", 0, "max tokens"), ("model", "/no/such/folder", "not a folder")])
    def test_rejects(self, field: str, value: object, match: str) -> None:
        with pytest.raises(ValueError, match=match):
            ServerConfig(**{field: value})  # type: ignore[arg-type]

    def test_defaults(self) -> None:
        config = ServerConfig()
        assert config.name == EMBEDDED_MODEL and config.host == "127.0.0.1"
        assert config.capacity == 10**9


class TestCli:
    def test_serve_flags(self) -> None:
        parser = argparse.ArgumentParser()
        register(parser.add_subparsers(dest="command"))
        args = parser.parse_args(["serve", "--cache-size", "64MB", "--system", "sglang+",
                                  "--port", "0", "--max-queue", "3", "--max-tokens", "5"])
        config = config_from_args(args)
        assert (config.capacity, config.system, config.max_queue, config.max_tokens) == (
            64 * 10**6, "sglang+", 3, 5)


class TestEngineHook:
    def test_on_token_streams_and_stops_early(self, model: HybridModel) -> None:
        prompt = np.arange(10, 50, dtype=np.int32)
        full = Engine(model, "marconi", "64MB").generate(prompt, 12)
        seen: list[int] = []
        engine = Engine(model, "marconi", "64MB")
        part = engine.generate(prompt, 12, on_token=lambda t: seen.append(t) or len(seen) < 5)
        assert seen == list(part.output) == list(full.output[:5])
        assert part.logits.shape[0] == 5
        again = engine.generate(np.concatenate([prompt, part.output, [7]]), 3)
        assert again.hit == len(prompt) + 5  # the state after the stopped output was kept


class TestTuner:
    def test_each_system_gets_its_own_tuner(self) -> None:
        from marconi.paper.tuner import BootstrapTuner
        from marconi.plus.shadows import ShadowTuner
        from marconi.server.backend import _tuner

        assert isinstance(_tuner(ServerConfig(system="marconi+")), ShadowTuner)
        bootstrap = _tuner(ServerConfig(system="marconi"))
        assert isinstance(bootstrap, BootstrapTuner) and not bootstrap.wait
        assert _tuner(ServerConfig(system="sglang+")) is None
        assert _tuner(ServerConfig(system="marconi", alpha=1.0)) is None
