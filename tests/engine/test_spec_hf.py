"""`spec.from_hf_config`: exact bytes, checked against real tensors and by hand."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache, JambaConfig

from marconi.core.families import ENGINE_FAMILIES, FAMILIES, Family, _registry
from marconi.core.spec import HF_FAMILIES, from_hf_config
from marconi.engines.hf import (
    ARCHITECTURES,
    architecture,
    forward,
    snapshot_kv,
    snapshot_state,
    tiny_model,
)


def _measure(model, tokens: int = 20) -> tuple[int, int]:
    """(KV bytes per token per attention layer, bytes of one SSM checkpoint), from tensors."""
    cache = model.new_cache()
    logits = forward(model, cache, torch.arange(tokens) % model.vocab_size, 0)
    kv = snapshot_kv(model, cache, 0, tokens)
    per_layer = kv.nbytes // (tokens * max(1, len(model.attention_layers)))
    return per_layer, snapshot_state(model, cache, tokens, logits).nbytes


class TestAgainstTensors:
    @pytest.mark.parametrize("arch", sorted(ENGINE_FAMILIES))
    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_engine_families(self, arch, dtype):
        model = tiny_model(arch, dtype=dtype)
        kv_layer, state = _measure(model)
        spec = model.spec
        assert spec.kv_layer_bytes_per_token == kv_layer
        assert spec.ssm_bytes == state
        assert spec.attention_layers == len(model.attention_layers)
        assert spec.ssm_layers == len(model.ssm_layers)
        assert spec.dtype_bytes == (4 if dtype == torch.float32 else 2)

    def test_jamba(self):
        config = JambaConfig(vocab_size=256, hidden_size=64, num_attention_heads=4,
                             num_key_value_heads=2, intermediate_size=128, num_hidden_layers=4,
                             attn_layer_period=2, attn_layer_offset=1, num_experts=2,
                             mamba_d_state=8)
        module = AutoModelForCausalLM.from_config(config).eval()
        cache = DynamicCache(config=config)
        with torch.inference_mode():
            module(input_ids=torch.arange(10)[None], cache=cache, use_cache=True,
                   position_ids=torch.arange(10)[None])
        spec = from_hf_config(config)
        conv = [layer.conv_states[0] for layer in cache.layers if hasattr(layer, "conv_states")]
        rec = [layer.recurrent_states[0] for layer in cache.layers if hasattr(layer, "conv_states")]
        kv = [layer.keys for layer in cache.layers if getattr(layer, "keys", None) is not None]
        held = sum(t.numel() * t.element_size() for t in conv + rec)
        assert (spec.ssm_layers, spec.attention_layers) == (len(conv), len(kv))
        assert spec.ssm_bytes == held
        assert spec.kv_bytes_per_token * 10 == sum(2 * k.numel() * k.element_size() for k in kv)


class TestByHand:
    def test_bamba_9b(self):
        cfg = {"model_type": "bamba", "hidden_size": 4096, "num_hidden_layers": 32,
               "attn_layer_indices": [9, 18, 27], "num_attention_heads": 32,
               "num_key_value_heads": 8, "mamba_n_heads": 128, "mamba_d_head": 64,
               "mamba_n_groups": 1, "mamba_d_state": 128, "mamba_d_conv": 4,
               "mamba_expand": 2, "torch_dtype": "bfloat16", "max_position_embeddings": 4096}
        spec = from_hf_config(cfg)
        assert (spec.attention_layers, spec.ssm_layers, spec.mlp_layers) == (3, 29, 32)
        assert spec.kv_dim == 8 * 128 and spec.dtype_bytes == 2 and spec.state_dtype_bytes == 4
        assert spec.ssm_state_elems == 128 * 64 * 128
        assert spec.conv_channels == 8192 + 2 * 128
        assert spec.ssm_layer_bytes == 128 * 64 * 128 * 4 + 8448 * 4 * 2
        assert spec.max_context == 4096

    def test_nemotron_h_pattern_string(self):
        cfg = {"model_type": "nemotron_h", "hidden_size": 4096,
               "hybrid_override_pattern": "M-M*-ME",
               "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
               "mamba_num_heads": 128, "mamba_head_dim": 64, "n_groups": 8,
               "ssm_state_size": 128, "conv_kernel": 4, "mamba_ssm_cache_dtype": "float16"}
        spec = from_hf_config(cfg)
        assert (spec.attention_layers, spec.ssm_layers, spec.mlp_layers) == (1, 3, 3)
        assert spec.conv_channels == 8192 + 2 * 8 * 128 and spec.state_dtype_bytes == 2

    def test_every_family_reads_its_defaults(self):
        for model_type in FAMILIES:
            spec = from_hf_config({"model_type": model_type, "hidden_size": 1024,
                                   "num_attention_heads": 8})
            assert spec.ssm_bytes > 0 and spec.name == model_type


class TestOneRegistry:
    """The engine and the cost model read one registry (core/families.py), not copies."""

    def test_the_engine_and_the_cost_model_agree_on_the_families(self):
        assert list(HF_FAMILIES) == list(FAMILIES), "the cost model's families"
        assert list(ARCHITECTURES) == list(ENGINE_FAMILIES), "the engine's families"
        assert set(ARCHITECTURES) <= set(HF_FAMILIES), "the engine runs what it cannot size"
        for name, read in HF_FAMILIES.items():
            assert read is FAMILIES[name].read, name
        for name, arch in ARCHITECTURES.items():
            facts = FAMILIES[name].engine
            assert facts is not None and arch.name == name, name
            assert (arch.tiny, arch.chunk_key) == (facts.tiny, facts.chunk_key), name

    def test_a_family_outside_the_engine_is_refused_by_it(self):
        outside = set(FAMILIES) - set(ENGINE_FAMILIES)
        for name in outside:
            with pytest.raises(ValueError, match=f"unsupported architecture {name!r}"):
                architecture(name)

    def test_a_family_declared_twice_fails(self):
        twice = Family(name="bamba", read=FAMILIES["bamba"].read, engine=None)
        with pytest.raises(ValueError, match="'bamba' declared twice"):
            _registry([FAMILIES["bamba"], twice])


class TestInputs:
    def test_path_file_and_folder(self, tmp_path):
        model = tiny_model("zamba2")
        model.config.save_pretrained(tmp_path)
        assert from_hf_config(tmp_path).ssm_bytes == model.spec.ssm_bytes
        by_file = from_hf_config(tmp_path / "config.json")
        assert by_file.kv_bytes_per_token == model.spec.kv_bytes_per_token

    def test_errors(self, tmp_path):
        with pytest.raises(ValueError, match="unsupported model_type 'llama'"):
            from_hf_config({"model_type": "llama", "hidden_size": 8})
        with pytest.raises(ValueError, match="cannot read"):
            from_hf_config(tmp_path / "missing.json")
        (tmp_path / "config.json").write_text("{not json")
        with pytest.raises(ValueError, match="cannot read"):
            from_hf_config(tmp_path)
        with pytest.raises(ValueError, match="must be an integer"):
            from_hf_config({"model_type": "bamba", "hidden_size": "big"})
        with pytest.raises(ValueError, match="unknown dtype"):
            from_hf_config({"model_type": "bamba", "hidden_size": 64, "num_attention_heads": 4,
                            "mamba_n_heads": 8, "dtype": "int3"})
