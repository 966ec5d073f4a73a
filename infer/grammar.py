"""Structured outputs: a grammar the judge's answer must follow, enforced token by token with llguidance
(guidance-ai's grammar engine, vLLM's `guidance` backend).

    a request's response_format / structured_outputs, or judge-score --structured's rubric
        -> Grammar (compiled and checked once, in the request's own thread, before the model sees it)
        -> Grammar.matcher(): one Matcher per answer ("choice"), in the model thread; before each token
           it writes its mask of allowed tokens into a row of a bitmask, after it takes the token written

The decoder applies the bitmask with `allowed_tokens`, a plain tensor op (shifts and a compare) that a CUDA
graph captures like the rest of a step. A row without a grammar has every bit set. The answer's stop token
is llguidance's end of text: it is allowed once the grammar is satisfied, and is the only token allowed
once the grammar is complete (a choice fully written, a JSON object closed).

JSON grammars are compact (no whitespace between tokens) unless asked otherwise: a small or badly tuned judge
left free to write whitespace writes it until max_tokens, the known failure of JSON mode (the tiny test judge
writes tabs). Asked for whitespace (vLLM's `disable_any_whitespace: false`, its default), they allow less of it
than vLLM's `whitespace_flexible` (WHITESPACE: a space, or a line break and indentation).

A grammar comes from a request (a server's): `within` compiles it in a daemon thread of its own and gives up
after a time limit, so that neither a request nor the server's shutdown waits for a grammar whose lexer
takes minutes (llguidance drops the GIL while it works; the thread, left to finish, stops nothing). At
most COMPILING grammars are compiled at once, the abandoned ones included until they finish: a flood of slow
grammars holds that many threads and cores, not one per request; a request that finds no free slot within
its time limit is refused as busy (GrammarBusy). A
grammar no text satisfies (a `$ref` cycle, an empty character class) is refused when compiled: its first
mask is computed then (which also builds the lexer's first states outside the model thread).
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import llguidance
import torch

# Between two JSON tokens: nothing, a space, or a line break and its indentation (pretty-printed JSON up to
# 4 levels of 4 spaces); never an endless run of blank space.
WHITESPACE = r"(?:\x20|\r?\n[\x20\x09]{0,16})?"
COMPACT = ""  # no whitespace between JSON tokens (the default)
BITS = 32  # llguidance's masks are rows of 32-bit words, token t at bit t % 32 of word t // 32
COMPILING = 2  # grammars compiled at once (module docstring)
_compiling = threading.BoundedSemaphore(COMPILING)


class GrammarError(ValueError):
    """A grammar llguidance cannot compile: an invalid schema, regex or Lark text (the message says where),
    one that no text satisfies, or one past a limit."""


class GrammarBusy(GrammarError):
    """No grammar could start compiling within the time limit: COMPILING others were (module docstring)."""


@dataclass(frozen=True, eq=False)  # hashed by identity: a key of the compiled grammars' cache
class Vocabulary:
    """The judge's tokens as llguidance reads them (their bytes), the width of the model's output layer,
    and the stop token that ends an answer."""

    tokenizer: llguidance.LLTokenizer
    size: int

    @classmethod
    def of(cls, tokenizer, size: int, stop_id: int) -> Vocabulary:
        """From a fast Hugging Face tokenizer; `size` covers the output layer's rows beyond the tokenizer (never
        allowed: they stand for no bytes)."""
        import llguidance.hf

        try:
            return cls(llguidance.hf.from_tokenizer(tokenizer, n_vocab=size, eos_token=stop_id), size)
        except ValueError as err:  # a slow (Python) tokenizer: llguidance reads a tokenizers' JSON
            raise GrammarError(f"structured outputs need a fast tokenizer ({err})") from None


@dataclass(frozen=True, eq=False)
class Grammar:
    """A compiled grammar for one vocabulary; `description` says what it constrains, for messages and logs."""

    vocabulary: Vocabulary
    description: str
    _prototype: llguidance.LLMatcher

    def matcher(self) -> Matcher:
        return Matcher(self._prototype.deep_copy())


class Matcher:
    """One answer's place in its grammar."""

    def __init__(self, matcher: llguidance.LLMatcher):
        self._matcher = matcher

    def fill(self, row: torch.Tensor) -> None:
        """The next token's mask into `row`, a contiguous int32 CPU tensor of the vocabulary's words."""
        self._matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())

    def failed(self) -> bool:
        """The matcher met an error (a grammar no text satisfies, or a limit of llguidance's): it allows the
        stop token alone from then on."""
        return self._matcher.is_error()

    def error(self) -> str:
        return self._matcher.get_error()

    def accept(self, token: int) -> None:
        """Take the token written: always one the last mask allowed, so a refusal is a fault of the decoder."""
        if not self._matcher.consume_token(token):
            raise RuntimeError(f"the grammar refused token {token}, which its own mask allowed: {self._matcher.get_error()}")


def compiled(vocabulary: Vocabulary, spec: str, description: str) -> Grammar:
    """`spec` (llguidance's serialized grammar) compiled for `vocabulary`, or GrammarError saying why not."""
    matcher = llguidance.LLMatcher(vocabulary.tokenizer, spec, log_level=0)
    if matcher.is_error():
        raise GrammarError(_message(matcher.get_error()))
    first = Matcher(matcher.deep_copy())
    first.fill(torch.empty(-(-vocabulary.size // BITS), dtype=torch.int32))
    if first.failed():  # llguidance's mask then holds the stop token alone: an answer of no text that says "stop"
        raise GrammarError(f"no text satisfies it ({_message(first.error().splitlines()[0])})")
    return Grammar(vocabulary, description, matcher)


def _message(error: str) -> str:
    return " ".join(line.strip() for line in error.strip().splitlines())[:500] or "invalid grammar"


def within(seconds: float, build: Callable[[], Grammar]) -> Grammar:
    """build() in a daemon thread, or GrammarError when it takes more than `seconds`, waiting for a free
    compile slot included (module docstring)."""
    done: Future = Future()
    deadline = time.monotonic() + seconds
    if not _compiling.acquire(timeout=seconds):
        raise GrammarBusy(f"{COMPILING} other grammars were still compiling after {seconds:g} s (--max_grammar_seconds); try again later")

    def run() -> None:
        try:
            done.set_result(build())
        except BaseException as err:  # noqa: BLE001 - handed to the waiting request, whatever it is
            done.set_exception(err)
        finally:
            _compiling.release()

    threading.Thread(target=run, name="grammar", daemon=True).start()
    try:
        return done.result(timeout=max(0.0, deadline - time.monotonic()))
    except TimeoutError:
        raise GrammarError(f"it takes more than {seconds:g} s to compile, this server's limit (--max_grammar_seconds)") from None


def bounded(schema: object) -> object:
    """`schema` with the limits it leaves out, so that an answer ends: an integer or a number of no range at most
    MAX_DIGITS digits before its point (|x| < 10**MAX_DIGITS), a string of no length, pattern, format or values at
    most MAX_STRING characters, an object's free keys (any key, as JSON mode's object and a schema that does not
    close its object allow) at most MAX_KEY characters, and a value of any kind (`{}`: any JSON) one of these
    bounded kinds (ANY). Neither vLLM nor llguidance bounds them: a judge left free to write digits, a string or a
    key writes until max_tokens (a number whose digits never end, a key that never closes: issue 56). What the
    schema bounds itself is kept as given. Not bounded: a number's fraction and exponent (JSON Schema cannot say
    how many digits), and the free keys of an object that declares keys and gives its other keys' values a schema
    (llguidance does not implement propertyNames: the free keys are a patternProperties entry, which a declared key
    matches too)."""
    root = _bounded(schema)
    if ANY_NAME not in json.dumps(root):
        return root
    root = root if isinstance(root, dict) else ANY_REF
    return {**root, "$defs": {**root.get("$defs", {}), ANY_NAME: _bounded(ANY)}}


def _bounded(schema: object, position: str = "value") -> object:
    """One (sub)schema bounded (`bounded`); `position` "value": where `{}` or true stands for any value at all."""
    if schema is True or (schema == {} and position == "value"):
        return ANY_REF
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key, value in schema.items():
        if key in SCHEMA_KEYS:
            out[key] = _bounded(value, "value" if key in ("items", "additionalItems") else "logic")
        elif key in SCHEMA_LIST_KEYS and isinstance(value, list):
            out[key] = [_bounded(item, "value" if key in ("prefixItems", "items") else "logic") for item in value]
        elif key in SCHEMA_MAP_KEYS and isinstance(value, dict):
            out[key] = {name: _bounded(item, "value" if key != "$defs" and key != "definitions" else "logic") for name, item in value.items()}
    if "const" in schema or "enum" in schema:
        return out
    kinds = schema.get("type")
    kinds = set(kinds) if isinstance(kinds, list) else {kinds} if isinstance(kinds, str) else set()
    if kinds & {"integer", "number"} and not RANGE_KEYS & schema.keys():
        out |= {"minimum": -(10**MAX_DIGITS - 1), "maximum": 10**MAX_DIGITS - 1}
    if "string" in kinds and not STRING_KEYS & schema.keys():
        out["maxLength"] = MAX_STRING
    free = schema.get("additionalProperties", True)
    # A declared key matches FREE_KEY too, and must then hold both values: any value does, another schema may not
    if ("object" in kinds and free is not False and not {"patternProperties", "propertyNames"} & schema.keys()
            and (free in (True, {}) or not schema.get("properties"))):
        out |= {"patternProperties": {FREE_KEY: _bounded(free)}, "additionalProperties": False}
    return out


MAX_DIGITS = 9  # an integer or number of no range: |x| < 10**9, within a 32-bit integer; a schema that needs more says so
MAX_STRING = 256  # a string of no maxLength (nor pattern, format or values): this many characters at most
MAX_KEY = 64  # an object's free key: this many characters at most
FREE_KEY = f"^(?s:.){{0,{MAX_KEY}}}$"
RANGE_KEYS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
STRING_KEYS = {"maxLength", "pattern", "format"}
# Where a JSON schema holds schemas: one, a list of them, or a map of names to them (the rest are values)
SCHEMA_KEYS = {"items", "additionalItems", "additionalProperties", "not", "if", "then", "else", "contains", "unevaluatedItems",
               "unevaluatedProperties", "propertyNames"}
SCHEMA_LIST_KEYS = {"allOf", "anyOf", "oneOf", "prefixItems", "items"}
SCHEMA_MAP_KEYS = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
# Any JSON value, each kind bounded (JSON mode's values, and a schema's `{}`)
ANY_NAME = "mmjudge_any_value"
ANY_REF = {"$ref": f"#/$defs/{ANY_NAME}"}
ANY = {"anyOf": [{"type": "null"}, {"type": "boolean"}, {"type": "number"}, {"type": "string"}, {"type": "array", "items": True},
                 {"type": "object"}]}


@functools.lru_cache(maxsize=256)  # a harness sends the same schema with every sample: compiled once
def _cached(vocabulary: Vocabulary, kind: str, text: str, whitespace: str | None) -> Grammar:
    if kind == "json":
        options = {"whitespace_flexible": False} if whitespace == COMPACT else {"whitespace_pattern": whitespace or WHITESPACE}
        try:
            spec = llguidance.LLMatcher.grammar_from_json_schema(text, defaults=options)
        except ValueError as err:
            raise GrammarError(str(err)) from None
        return compiled(vocabulary, spec, "a JSON schema")
    if kind == "regex":
        return compiled(vocabulary, llguidance.LLMatcher.grammar_from_regex(text), "a regular expression")
    if kind == "choice":
        return compiled(vocabulary, llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(map(json.dumps, json.loads(text)))),
                        "a choice")
    if kind == "grammar":
        try:
            return compiled(vocabulary, llguidance.grammar_from("grammar", text), "a grammar")
        except ValueError as err:  # GBNF that does not convert to Lark
            raise GrammarError(str(err)) from None
    raise ValueError(f"unknown grammar kind {kind!r}")


def json_schema(vocabulary: Vocabulary, schema: dict | bool, whitespace: str | None = COMPACT) -> Grammar:
    """JSON valid against `schema` ({} or True: any JSON value). `whitespace`: the pattern of whitespace
    between tokens (COMPACT: none at all; None: WHITESPACE)."""
    return _cached(vocabulary, "json", json.dumps(bounded(schema)), whitespace)  # in its order: an answer writes its keys so


def json_object(vocabulary: Vocabulary, whitespace: str | None = COMPACT) -> Grammar:
    """Any JSON object (OpenAI's and vLLM's JSON mode)."""
    return json_schema(vocabulary, {"type": "object"}, whitespace)


def regex(vocabulary: Vocabulary, pattern: str) -> Grammar:
    """Text that matches `pattern` as a whole (Rust's regex syntax, as vLLM's guidance backend reads it)."""
    return _cached(vocabulary, "regex", pattern, None)


def choice(vocabulary: Vocabulary, options: list[str]) -> Grammar:
    """Exactly one of `options`."""
    return _cached(vocabulary, "choice", json.dumps(options), None)


def grammar(vocabulary: Vocabulary, text: str) -> Grammar:
    """A context-free grammar in Lark's syntax, or GBNF (llama.cpp's, which vLLM's xgrammar backend reads)."""
    return _cached(vocabulary, "grammar", text, None)


@functools.lru_cache(maxsize=64)
def score_lines(vocabulary: Vocabulary, labels: tuple[str, ...], levels: tuple[str, ...]) -> Grammar:
    """A judge's answer in the layout its rubric asks for (judge/parsing.py): free text, then one line
    `<label>: <level>` per criterion in the rubric's order, a `### Score` line and the overall score alone;
    every score one of `levels`. The free text cannot hold `### Score`, so the first heading the parser
    finds is the constrained one, and the criterion lines it reads (the last of each label) are too."""
    from mmjudge.judge.parsing import SCORE_HEADING

    level = " | ".join(map(json.dumps, levels))
    lines = " ".join(f"{json.dumps(f'{label}: ')} LEVEL {json.dumps(chr(10))}" for label in labels)
    heading = json.dumps(f"{SCORE_HEADING}\n")
    any_text, holding_heading = "/(?s:.*)/", f"/(?s:.*){SCORE_HEADING}(?s:.*)/"  # '#' and ' ' are literals in a regex
    lark = (f"start: ANSWER\nFREE: {any_text} & ~{holding_heading}\nLEVEL: {level}\n"
            f"ANSWER: FREE {json.dumps(chr(10))} {lines} {heading} LEVEL\n")
    return compiled(vocabulary, llguidance.LLMatcher.grammar_from_lark(lark), f"one line per criterion ({', '.join(labels)}) and a score line, "
                                                                          f"each scored {' | '.join(levels)}")


def token_masks(matchers: list[Matcher | None], size: int) -> torch.Tensor | None:
    """Each row's mask of the next of `size` tokens, every bit set for a row without a matcher; None where
    no row has one (no mask is applied at all)."""
    if not any(matchers):
        return None
    masks = torch.full((len(matchers), -(-size // BITS)), -1, dtype=torch.int32)
    for row, matcher in enumerate(matchers):
        if matcher is not None:
            matcher.fill(masks[row])
    return masks


def allowed_tokens(masks: torch.Tensor, size: int) -> torch.Tensor:
    """(rows, words) int32 bitmasks -> (rows, size) bool: token t allowed where bit t % 32 of word t // 32 is
    set. Shifts and a compare, so a CUDA graph captures it with the step."""
    bits = torch.arange(BITS, dtype=torch.int32, device=masks.device)
    return ((masks[:, :, None] >> bits) & 1).flatten(1)[:, :size].bool()
