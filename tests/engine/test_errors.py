"""Bad input fails with a ValueError that names what is wrong."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marconi.engines.hf import Engine, Sampling, architecture, load_model, tiny_model


class TestArchitecture:
    def test_unsupported(self):
        with pytest.raises(ValueError, match="unsupported architecture 'jamba'"):
            architecture("jamba")
        with pytest.raises(ValueError, match="unsupported architecture 'llama'"):
            tiny_model("llama")


class TestCheckpoint:
    def test_round_trip(self, tmp_path):
        model = tiny_model("bamba", seed=3)
        model.module.save_pretrained(tmp_path)
        loaded = load_model(tmp_path)
        ids = torch.arange(12)[None]
        with torch.inference_mode():
            a = model.module(input_ids=ids).logits
            b = loaded.module(input_ids=ids).logits
        assert torch.equal(a, b) and loaded.spec == model.spec

    def test_missing(self, tmp_path):
        with pytest.raises(ValueError, match="does not exist"):
            load_model(tmp_path / "nope")
        with pytest.raises(ValueError, match=r"no config\.json"):
            load_model(tmp_path)
        tiny_model("bamba").config.save_pretrained(tmp_path)
        with pytest.raises(ValueError, match=r"no \*\.safetensors"):
            load_model(tmp_path)

    def test_corrupt_weights(self, tmp_path):
        tiny_model("bamba").config.save_pretrained(tmp_path)
        (tmp_path / "model.safetensors").write_bytes(b"\x00garbage" * 10)
        with pytest.raises(ValueError, match="cannot load weights"):
            load_model(tmp_path)

    def test_unsupported_checkpoint_architecture(self, tmp_path):
        (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
        (tmp_path / "model.safetensors").write_bytes(b"")
        with pytest.raises(ValueError, match="unsupported architecture 'gpt2'"):
            load_model(tmp_path)


class TestRequests:
    def test_prompt_longer_than_the_model_limit(self):
        engine = Engine(tiny_model("bamba", max_position_embeddings=64), "sglang+")
        with pytest.raises(ValueError, match="exceeds the model's limit of 64"):
            engine.generate(np.zeros(60, dtype=np.int32), 8)

    def test_bad_tokens(self):
        engine = Engine(tiny_model("bamba"), "sglang+")
        with pytest.raises(ValueError, match="outside the model's vocabulary"):
            engine.generate([1, 2, 999], 2)
        with pytest.raises(ValueError, match="at least one prompt token"):
            engine.generate([], 2)
        with pytest.raises(ValueError, match="prompt"):
            engine.generate([[1, 2]], 2)
        with pytest.raises(ValueError, match="temperature"):
            Sampling(temperature=-1.0)
