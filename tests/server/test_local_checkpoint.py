"""`--model PATH`: a local checkpoint with its own tokenizer files and chat template."""

from __future__ import annotations

from pathlib import Path

import pytest

from marconi.engines.hf import tiny_model
from tests.server.harness import serve

VOCAB = 64


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Bamba saved as safetensors, with a word-level tokenizer and a template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tiny-bamba")
    tiny_model("bamba", vocab_size=VOCAB).module.save_pretrained(folder)
    words = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i + 3 for i in range(VOCAB - 3)}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
    fast.chat_template = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} "
                          "{% endfor %}assistant")
    fast.save_pretrained(folder)
    return folder


class TestLocalCheckpoint:
    def test_serves_with_its_own_tokenizer(self, checkpoint: Path) -> None:
        with serve(tiny_model("bamba", vocab_size=VOCAB), model=checkpoint,
                   served_name="local", capacity="16MB") as server:
            client = server.client()
            assert [m.id for m in client.models.list().data] == ["local"]
            shared = " ".join(f"w{i}" for i in range(3, 30))
            cached = [client.chat.completions.create(
                model="local", max_tokens=3,
                messages=[{"role": "system", "content": shared},
                          {"role": "user", "content": end}]).usage.prompt_tokens_details
                .cached_tokens for end in ("w40", "w41", "w42")]
            assert cached[0] == cached[1] == 0 and cached[2] >= 27
            reply = client.completions.create(model="local", prompt="w5 w6 w7", max_tokens=2)
            assert reply.usage.prompt_tokens == 3
