"""A chat answer in OpenAI's shape: each choice's text as judge-score decodes feedback, cut before the
first stop sequence, with its log-probabilities; whole, or as the server-sent events of a stream.

A stop sequence ends a choice where the text first holds it (checked after each written token, as vLLM
does); the text is cut before it and the choice's finish_reason is "stop", as it is for the stop token.
A stream sends each choice's text as it is written, short of what may still change: the tokenizer's
clean-up can join a following token to the text before the last whitespace, a stop sequence may be
beginning, and a character may be half written. Its pieces put together are the whole answer's text.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from mmjudge.infer.decoding import Completion

Decode = Callable[[list[int]], str]
RawBytes = Callable[[int], bytes]  # a token's own bytes


class ChoiceText:
    """One choice's text as its tokens come. Told each token in the model thread, it decodes only the last
    few tokens to see whether a stop sequence may have come (a token writes at least one byte of text, and a
    character is at most four), and the whole text only then; `exact` decodes the whole text at every token."""

    def __init__(self, decode: Decode, stops: list[str], stop_ids: tuple[int, ...], exact: bool = False):
        self.decode, self.stops, self.stop_ids, self.exact = decode, stops, stop_ids, exact
        self.window = 4 * max(map(len, stops), default=0) + 8
        self.tokens: list[int] = []  # the tokens of the text: the stop token left out
        self.cut: int | None = None  # where a stop sequence begins in the text of the tokens
        self.stopped = False  # by the stop token or a stop sequence

    @classmethod
    def of(cls, tokens: list[int], decode: Decode, stops: list[str], stop_ids: tuple[int, ...]) -> ChoiceText:
        """The text of a finished choice. Decoded whole first: only a text that holds a stop sequence is
        read token by token, to find the one that ended it."""
        end = next((i for i, token in enumerate(tokens) if token in stop_ids), len(tokens))
        choice = cls(decode, [], stop_ids)
        choice.tokens, choice.stopped = tokens[:end], end < len(tokens)
        text = decode(choice.tokens)
        if stops and any(stop in text for stop in stops):
            choice = cls(decode, stops, stop_ids, exact=True)
            for token in tokens:
                if not choice.add(token):
                    break
        return choice

    @property
    def text(self) -> str:
        return self.decode(self.tokens[:])[: self.cut]

    def add(self, token: int) -> bool:
        """Take the next written token; False once the choice has ended."""
        if self.stopped:
            return False
        if token in self.stop_ids:
            self.stopped = True
            return False
        self.tokens.append(token)
        if not self.stops:
            return True
        tail = self.decode(self.tokens if self.exact else self.tokens[-self.window:])
        if any(stop in tail for stop in self.stops):
            text = tail if self.exact else self.decode(self.tokens)
            if found := [at for stop in self.stops if (at := text.find(stop)) >= 0]:
                self.cut, self.stopped = min(found), True
        return not self.stopped

    def settled(self) -> str:
        """The text that no later token can change (module docstring)."""
        text = self.text
        if found := [at for stop in self.stops if (at := text.find(stop)) >= 0]:  # read while the model thread cuts it
            return text[: min(found)]
        if self.stopped:
            return text
        end = len(text.rstrip("\ufffd"))
        end = min(end, max((k for k, c in enumerate(text) if c.isspace()), default=end))
        for stop in self.stops:
            for length in range(min(len(stop) - 1, end), 0, -1):
                if text[end - length:end] == stop[:length]:
                    end -= length
                    break
        return text[:end]

    def finish_reason(self) -> str:
        return "stop" if self.stopped else "length"


def token_entry(decode: Decode, before: list[int], token: int, logprob: float, raw: RawBytes | None = None) -> dict:
    """A token as OpenAI's logprobs show it: the text it adds after the tokens before it (a SentencePiece
    token decoded alone loses its leading space), and that text's UTF-8 bytes; a token of part of a
    character (a byte-fallback token, whose text is U+FFFD) gives its own bytes, so that the bytes of the
    tokens joined spell the answer, as OpenAI's `bytes` are for."""
    context = before[-4:]
    prefix = decode(context)
    whole = decode(context + [token])
    text = whole[len(prefix):] if whole.startswith(prefix) else decode([token])
    token_bytes = raw(token) if raw is not None and "\ufffd" in text else text.encode("utf-8")
    return {"token": text, "logprob": logprob, "bytes": list(token_bytes)}


def logprob_entries(decode: Decode, tokens: list[int], completion: Completion, shown: int, raw: RawBytes | None = None) -> list[dict]:
    """Each token of the text with its log-probability and the step's `shown` likeliest tokens. `raw`: a
    token's own bytes, where the judge's vocabulary is known (serve/app.py)."""
    return [{**token_entry(decode, tokens[:step], token, completion.top_logprobs[step, 0].item(), raw),
             "top_logprobs": [token_entry(decode, tokens[:step], alternative, logprob, raw) for alternative, logprob
                              in zip(completion.top_ids[step, :shown].tolist(), completion.top_logprobs[step, :shown].tolist())]}
            for step, token in enumerate(tokens)]


def usage(prompt_tokens: int, completions: list[Completion]) -> dict:
    written = sum(len(c.tokens) for c in completions)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": written, "total_tokens": prompt_tokens + written}


def sse(chunk: dict | str) -> str:
    return f"data: {chunk if isinstance(chunk, str) else json.dumps(chunk)}\n\n"


def chunk(request_id: str, created: int, model: str, choices: list[dict], **extra) -> dict:
    return {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model, "choices": choices, **extra}


def now() -> int:
    return int(time.time())
