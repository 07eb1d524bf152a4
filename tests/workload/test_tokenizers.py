from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from marconi.workload.tokenizers import TOKENIZERS, encode_unique, get_tokenizer, mistral_v1_path

TEXTS = ["Hello world", "  two  spaces\tand\ttabs\n", "ünïcode 日本語 🙂", "", "Hello world"]


class TestTokenizers:
    @pytest.mark.parametrize("name", sorted(TOKENIZERS))
    def test_round_trip(self, name: str) -> None:
        tok = get_tokenizer(name)
        for text, ids in zip(TEXTS, tok.encode_batch(TEXTS), strict=True):
            assert ids.dtype == np.int32
            assert tok.decode(ids.tolist()).strip() == text.strip()

    def test_mistral_matches_mistral_common(self) -> None:
        mc = pytest.importorskip("mistral_common.tokens.tokenizers.mistral")
        ref = mc.MistralTokenizer.v1().instruct_tokenizer.tokenizer
        ours = get_tokenizer("mistral-v1").encode_batch(TEXTS)
        assert [a.tolist() for a in ours] == [ref.encode(t, bos=False, eos=False) for t in TEXTS]

    def test_sentencepiece_path_and_hf_json(self, tmp_path: Path) -> None:
        sp = get_tokenizer(str(mistral_v1_path()))
        assert sp.encode_batch(["Hello world"])[0].tolist() == [22557, 1526]
        tokenizers = pytest.importorskip("tokenizers")
        vocab = {"[UNK]": 0, "hello": 1, "world": 2}
        hf = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
        hf.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
        hf.save(str(tmp_path / "tokenizer.json"))
        tok = get_tokenizer(str(tmp_path / "tokenizer.json"))
        assert tok.encode_batch(["hello world moon"])[0].tolist() == [1, 2, 0]

    def test_encode_unique_keeps_order_and_duplicates(self) -> None:
        out = encode_unique(get_tokenizer("mistral-v1"), TEXTS)
        assert len(out) == len(TEXTS) and out[0].tolist() == out[-1].tolist()

    def test_batches_give_the_ids_of_one_batch(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Past the progress threshold texts are encoded in batches (with a bar on a
        terminal): the same ids, in the same order, with every batch boundary crossed."""
        import marconi.workload.tokenizers as module

        tok = get_tokenizer("mistral-v1")
        texts = [f"text {i} {'word ' * (i % 7)}" for i in range(23)] + TEXTS
        whole = encode_unique(tok, texts)
        monkeypatch.setattr(module, "PROGRESS_TEXTS", 2)
        monkeypatch.setattr(module, "BATCH_TEXTS", 5)
        batched = encode_unique(tok, texts)
        assert [a.tolist() for a in batched] == [a.tolist() for a in whole]

    def test_unknown_tokenizer(self) -> None:
        with pytest.raises(ValueError, match="unknown tokenizer 'nope'"):
            get_tokenizer("nope")

    def test_hugging_face_folder_is_a_tokenizer(self, tmp_path: Path) -> None:
        from tests.workload.test_openai import tokenizer_folder

        folder = tokenizer_folder(tmp_path / "tok")
        tok = get_tokenizer(str(folder))
        vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
        assert tok.encode_batch(["hello there"])[0].tolist() == [vocab["hello"], vocab["there"]]
        assert tok.bos_id == 1  # tokenizer_config.json's bos_token
        assert tok.identity != get_tokenizer(str(folder / "tokenizer.json")).identity

    def test_folder_tokenizer_through_the_cli(self, tmp_path: Path,
                                              capsys: pytest.CaptureFixture) -> None:
        from tests.workload.test_openai import tokenizer_folder

        from marconi.cli import main

        folder = tokenizer_folder(tmp_path / "tok", template=None)
        trace = tmp_path / "chat.json"
        conv = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello there"}]
        trace.write_text(json.dumps([{"id": "a", "conversations": conv * 2}]))
        assert main(["simulate", str(trace), "--tokenizer", str(folder), "--min-turns", "1",
                     "--json", "--quiet", "--no-trace-cache"]) == 0
        assert json.loads(capsys.readouterr().out)["requests"] == 2

    @pytest.mark.parametrize("content", ["", "{not json", '{"model": {}}'])
    def test_unreadable_tokenizer_json_is_an_error_naming_it(
            self, tmp_path: Path, capsys: pytest.CaptureFixture, content: str) -> None:
        from marconi.cli import main

        path = tmp_path / "empty.json"
        path.write_text(content)
        with pytest.raises(ValueError, match=r"empty.json: not a tokenizer.json"):
            get_tokenizer(str(path))
        assert main(["simulate", "sharegpt", "--tokenizer", str(path), "--quiet",
                     "--sessions", "2", "--no-trace-cache"]) == 2
        err = capsys.readouterr().err
        assert "empty.json: not a tokenizer.json" in err and "Traceback" not in err
