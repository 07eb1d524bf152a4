from __future__ import annotations

import numpy as np
import pytest

from marconi.core.spec import PAPER_7B, ModelSpec, resolve_model


class TestPaper7B:
    def test_ssm_state_bytes_per_layer(self) -> None:
        # 2 D N + (2 D + 2 N) * 4 * 2 = 1,048,576 + 67,584
        assert PAPER_7B.ssm_layer_bytes == 1_116_160

    def test_kv_bytes_per_token_per_layer(self) -> None:
        assert PAPER_7B.kv_layer_bytes_per_token == 16_384  # 4 D in fp16

    def test_totals_over_layers(self) -> None:
        assert PAPER_7B.ssm_bytes == 24 * 1_116_160
        assert PAPER_7B.kv_bytes_per_token == 4 * 16_384

    def test_flops_by_hand(self) -> None:
        L, D, N = 1000, 4096, 128
        attention = 8 * L * D**2 + 4 * L**2 * D
        mlp = 16 * L * D**2
        ssm = 12 * L * D**2 + 16 * L * D * N + 10 * L * D
        assert PAPER_7B.flops(L) == 4 * attention + 28 * mlp + 24 * ssm
        assert PAPER_7B.flops(0) == 0

    def test_flops_array_agrees(self) -> None:
        lengths = np.array([0, 1, 17, 4096, 32768])
        expected = [PAPER_7B.flops(int(n)) for n in lengths]
        np.testing.assert_allclose(PAPER_7B.flops_array(lengths), expected, rtol=1e-12)

    def test_flop_efficiency_grows_with_length(self) -> None:
        # the paper's asymmetry: a state's FLOPs per byte grow ~linearly with L
        eff = [PAPER_7B.flops(n) / PAPER_7B.ssm_bytes for n in (1000, 10_000)]
        assert eff[1] > 9 * eff[0]


class TestOverrides:
    def test_layer_ratio(self) -> None:
        spec = resolve_model("paper-7b,ssm=28,attn=7")
        assert (spec.ssm_layers, spec.attention_layers) == (28, 7)
        assert spec.kv_bytes_per_token == 7 * 16_384

    def test_state_dimension(self) -> None:
        spec = resolve_model("paper-7b,N=16")
        assert spec.ssm_layer_bytes == 2 * 4096 * 16 + (2 * 4096 + 2 * 16) * 4 * 2

    def test_exact_real_model_fields(self) -> None:
        spec = PAPER_7B.replace(kv_dim=1024, ssm_state_elems=100, conv_channels=10,
                                state_dtype_bytes=4)
        assert spec.kv_layer_bytes_per_token == 2 * 1024 * 2
        assert spec.ssm_layer_bytes == 100 * 4 + 10 * 4 * 2

    @pytest.mark.parametrize("text,word", [
        ("gpt-9", "unknown model"), ("paper-7b,ssm", "bad model override"),
        ("paper-7b,foo=1", "bad model override"), ("paper-7b,ssm=x", "not an integer"),
        ("paper-7b,ssm=-1", "non-negative"), ("paper-7b,d_state=0", "positive")])
    def test_bad_values(self, text: str, word: str) -> None:
        with pytest.raises(ValueError, match=word):
            resolve_model(text)

    def test_no_layers_refused(self) -> None:
        with pytest.raises(ValueError, match="at least one"):
            ModelSpec(d_model=8, attention_layers=0, ssm_layers=0, mlp_layers=1, d_state=4)
