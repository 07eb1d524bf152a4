"""Chat templates for request logs: messages -> the prompt's token ids, and the reply's.

Two templates behind one call, `render(chats) -> [Rendered]` (batched, so each distinct
text is tokenized once):

- `PiecewiseTemplate`: the embedded server's template (docs/architecture.md, `server/chat.py`),
  every piece tokenized on its own, so a conversation's tokens only grow at the end and
  each message end is a known token offset::

      <s> <|system|>{system} <|user|>{user} <|assistant|>{reply} <|user|>{user} <|assistant|>

- `JinjaTemplate`: a Hugging Face tokenizer folder's own chat template (Jinja, rendered in
  a sandbox as `transformers` renders it), the whole prompt tokenized at once. The reply's
  tokens are what rendering the conversation with the reply appends to the prompt.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from marconi.workload.tokenizers import (
    Tokenizer,
    chat_template,
    encode_unique,
    get_tokenizer,
    special_tokens,
)
from marconi.workload.types import Tokens

Message = dict[str, Any]  # {"role", "content" (text), ...} as logged


class Chat(NamedTuple):
    messages: Sequence[Message]  # the request's messages, content flattened to text
    reply: str | None  # the model's answer, when the log knows it


class Rendered(NamedTuple):
    prompt: Tokens  # what the request prefills
    reply: Tokens  # what it decodes (empty when unknown)
    ends: tuple[int, ...]  # message ends strictly inside the prompt, where known


class Template(Protocol):
    name: str

    def render(self, chats: Sequence[Chat]) -> list[Rendered]: ...


def message_text(message: Message) -> str:
    """A message's text as the piecewise template renders it: its content, then its tool
    calls as JSON when it makes any (an assistant turn may be tool calls alone)."""
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    calls = message.get("tool_calls")
    return text + json.dumps(calls) if calls else text


class PiecewiseTemplate:
    """`<s>` then `<|role|>` + content per message, then `<|assistant|>`; see above."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.name = f"piecewise({tokenizer.name})"

    def render(self, chats: Sequence[Chat]) -> list[Rendered]:
        texts = [message_text(m) for chat in chats for m in chat.messages]
        texts += [chat.reply or "" for chat in chats]
        texts += [f"<|{m['role']}|>" for chat in chats for m in chat.messages] + ["<|assistant|>"]
        memo = dict(zip(texts, encode_unique(self.tokenizer, texts), strict=True))
        return [self._one(chat, memo) for chat in chats]

    def _one(self, chat: Chat, memo: dict[str, Tokens]) -> Rendered:
        bos = self.tokenizer.bos_id
        parts: list[Tokens] = [np.array([] if bos is None else [bos], dtype=np.int32)]
        for message in chat.messages:
            parts += [memo[f"<|{message['role']}|>"], memo[message_text(message)]]
        ends = np.cumsum([p.shape[0] for p in parts])[2::2]  # after each message's content
        prompt = np.concatenate([*parts, memo["<|assistant|>"]])
        return Rendered(prompt, memo[chat.reply or ""], tuple(int(e) for e in ends))


class JinjaTemplate:
    """A tokenizer folder's chat template; see the module docstring."""

    def __init__(self, folder: Path, source: str) -> None:
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._template = env.from_string(source)
        self._special = special_tokens(folder)
        self.tokenizer = get_tokenizer(str(folder))
        self.name = f"chat template of {folder}"

    def text(self, messages: Sequence[Message], *, generation: bool) -> str:
        """The template's text for `messages` (ValueError when the template refuses them)."""
        from jinja2 import TemplateError

        try:
            return str(self._template.render(messages=list(messages),
                                             add_generation_prompt=generation, **self._special))
        except TemplateError as err:
            raise ValueError(f"{self.name}: {err}") from None

    def render(self, chats: Sequence[Chat]) -> list[Rendered]:
        prompts = [self.text(c.messages, generation=True) for c in chats]
        full = [self.text([*c.messages, {"role": "assistant", "content": c.reply}],
                          generation=False) if c.reply else "" for c in chats]
        replies = [c.reply or "" for c in chats]
        tokens = encode_unique(self.tokenizer, [*prompts, *full, *replies])
        n = len(chats)
        return [Rendered(p, _continuation(p, f, r), ())
                for p, f, r in zip(tokens[:n], tokens[n:2 * n], tokens[2 * n:], strict=True)]


def _continuation(prompt: Tokens, full: Tokens, reply: Tokens) -> Tokens:
    """What the template appends after the prompt for the reply, or the reply's own tokens
    when the rendered conversation does not start with the prompt."""
    k = prompt.shape[0]
    if full.shape[0] > k and np.array_equal(full[:k], prompt):
        return full[k:]
    return reply


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _raise(message: str) -> None:
    from jinja2 import TemplateError

    raise TemplateError(message)


def template_for(tokenizer: str) -> Template:
    """A tokenizer folder's own template when it has one, else the piecewise template."""
    path = Path(tokenizer).expanduser()
    source = chat_template(path) if path.is_dir() else None
    if source is not None:
        return JinjaTemplate(path, source)
    return PiecewiseTemplate(get_tokenizer(tokenizer))
