"""Chat templates: one user turn, rendered as the backbone's reference renders it.

Every template here is InternVL's "MPT" separator style, which is also the ChatML layout of Qwen-VL: an optional
system turn, then the user's role + query + separator, and the assistant's role left open for the model to
continue:

    phi3-chat       <|system|>\n{system}<|end|><|user|>\n{query}<|end|><|assistant|>\n
    internlm2-chat  <|im_start|>system\n{system}<|im_end|><|im_start|>user\n{query}<|im_end|><|im_start|>assistant\n
    Hermes-2        (the same ChatML layout as internlm2-chat)
    internvl2_5     the same with the separator "<|im_end|>\n" (InternVL2.5 and InternVL3)
    Qwen-VL         <|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{query}<|im_end|>\n<|im_start|>assistant\n
                    (Qwen2.5-VL's default system message is "You are a helpful assistant."; Qwen3-VL has none:
                    without one, no system turn)

The model stops at the separator's token (`<|end|>` or `<|im_end|>`), which is also what a trained target ends
with. A template and its default system message are read from the checkpoint, as data, never executed:

- InternVL's original format names its template in config.json; the checkpoint's own `conversation.py` defines
  it (`Conversation(name=..., system_template=..., system_message=..., roles=..., sep=...)`, read with `ast`),
  and config.json's `system_message` overrides the default. Without a conversation.py, the built-in TEMPLATES
  below (InternVL's published ones) stand in.
- A Hugging Face-native checkpoint (Qwen-VL, InternVL's -hf) ships a Jinja chat template
  (`chat_template.jinja`, `chat_template.json`, or tokenizer_config.json's `chat_template`).
  `template_from_jinja` renders it on marker messages and reads the roles, separator and default system
  message off the result; a template that does not render one user turn in this layout is refused. Where it opens
  an answer with more than its generation prompt (Qwen3.5's empty thinking block), the judge is prompted with the
  opening its answers are rendered after; where it strips the whitespace at a message's ends (Qwen3.5's `|trim`),
  so does the judge's prompt. A Jinja
  template is code of its own (loops), so it is rendered under a time and an output-size limit
  (`RENDER_SECONDS`, `RENDER_CHARS`), in a sandbox where no one step makes a value past RENDER_CHARS
  (`_BoundedSandbox`), and an empty one is refused rather than replaced by a default.

A rendered turn is also known as parts (`ChatTemplate.parts`): the template's own strings, whose control
tokens are the only ones the turn may hold, and the text it frames (system message, query), which is
read as text whatever it says (mmjudge.judge.prompts.encode_prompt).
"""

from __future__ import annotations

import ast
import functools
import json
import math
import re
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from jinja2.compiler import CodeGenerator
from jinja2.runtime import markup_join, str_join
from jinja2.sandbox import ImmutableSandboxedEnvironment

from mmjudge.judge.data import InputError, Problem, read_text

# A piece of a prompt, and whether it is the template's own (True: its special tokens are control tokens)
# or text from elsewhere (False: read as text, whatever it says).
Part = tuple[str, bool]
Span = tuple[int, int]  # [start, end) in a prompt's text


def join_parts(parts: list[Part]) -> tuple[str, tuple[Span, ...]]:
    """The text of some parts, and the spans of the template's own among them."""
    text, controls, start = [], [], 0
    for piece, control in parts:
        if control and piece:
            controls.append((start, start + len(piece)))
        text.append(piece)
        start += len(piece)
    return "".join(text), tuple(controls)


def trimmed(parts: list[Part]) -> list[Part]:
    """The parts less the whitespace at the two ends of their text, as Jinja's `trim` strips a message's."""
    text = "".join(piece for piece, _ in parts)
    lead, end = len(text) - len(text.lstrip()), len(text.rstrip())
    kept, start = [], 0
    for piece, control in parts:
        stop = start + len(piece)
        if (cut := piece[max(lead - start, 0): max(min(end, stop) - start, 0)]) or not piece:
            kept.append((cut, control))
        start = stop
    return kept


# InternVL2's default system message, as its conversation.py defines it for these templates.
INTERNVL_SYSTEM_MESSAGE = "你是由上海人工智能实验室联合商汤科技开发的书生多模态大模型，英文名叫InternVL, 是一个有用无害的人工智能助手。"


@dataclass(frozen=True)
class ChatTemplate:
    name: str
    system_template: str  # contains {system_message}
    user_role: str
    assistant_role: str
    separator: str
    default_system_message: str | None = INTERNVL_SYSTEM_MESSAGE  # None: no system turn unless one is given
    trims: bool = False  # it strips the whitespace at the ends of each message's text (Qwen3.5's `|trim`)

    def render(self, query: str, system_message: str | None = None) -> str:
        """The prompt for one user turn, ending where the assistant's answer begins."""
        return "".join(text for text, _ in self.parts([(query, False)], system_message))

    def parts(self, query: list[Part], system_message: str | None = None) -> list[Part]:
        """`render`'s turn in parts around a query given in parts (its image tokens are the prompt's own)."""
        system = self.default_system_message if system_message is None else system_message
        if self.trims:
            query, system = trimmed(query), None if system is None else system.strip()
        turn = [*query, (self.separator + self.assistant_role, True)]
        if system is None:
            return [(self.user_role, True), *turn]
        head, tail = self.system_template.split("{system_message}")
        return [(head, True), (system, False), (tail + self.separator + self.user_role, True), *turn]

    def target(self, answer: str) -> str:
        """What a trained judge must produce after `render`: the answer and the stop separator."""
        return "".join(text for text, _ in self.target_parts(answer))

    def target_parts(self, answer: str) -> list[Part]:
        return [(answer.strip() if self.trims else answer, False), (self.separator, True)]

    @property
    def stop_token(self) -> str:
        return self.separator.strip()

    def jinja(self, system_message: str | None = None, lead: str = "", image: str = "<image>") -> str:
        """This template as a Jinja chat template: what a server that renders its own is given (vLLM's
        `--chat-template`), and what a judge saved in transformers' layout carries where its checkpoint had none
        (judge.model.save_native). A system message (else the default), then user and assistant turns, each
        content a string or a list of parts: a text part is its text, any other part `image` (the image token
        a processor expands into the image's tokens). With add_generation_prompt, one user turn renders as
        `render` does, after the tokenizer's BOS, which the local judge's tokenizer adds and vLLM adds to a
        rendered chat only when the template does, and after `lead`: what the judge's reference tokenizer
        reads after BOS and transformers 5's does not (judge.detokenize.reference_lead). Every literal is a
        quoted string, so that Jinja's whitespace rules cannot touch it."""
        quoted = lambda text: "{{ " + json.dumps(text) + " }}"  # noqa: E731 - JSON's escapes are Jinja's too
        system_before, _, system_after = self.system_template.partition("{system_message}")
        default = self.default_system_message if system_message is None else system_message
        return ("{% macro content(message) %}{% if message['content'] is string %}{{ message['content'] }}{% else %}"
                "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% else %}" + quoted(image)
                + "{% endif %}{% endfor %}{% endif %}{% endmacro %}"
                "{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}{% set turns = messages[1:] %}"
                "{% else %}{% set system = " + ("none" if default is None else json.dumps(default)) + " %}{% set turns = messages %}{% endif %}"
                "{% if bos_token %}{{ bos_token }}{% endif %}" + quoted(lead)
                + "{% if system is not none %}" + quoted(system_before) + "{{ system }}" + quoted(system_after + self.separator) + "{% endif %}"
                "{% for message in turns %}{% if message['role'] == 'user' %}" + quoted(self.user_role) + "{{ content(message) }}"
                + quoted(self.separator) + "{% elif message['role'] == 'assistant' %}" + quoted(self.assistant_role)
                + "{{ content(message) }}" + quoted(self.separator) + "{% endif %}{% endfor %}"
                "{% if add_generation_prompt %}" + quoted(self.assistant_role) + "{% endif %}")


_CHATML = dict(
    system_template="<|im_start|>system\n{system_message}",
    user_role="<|im_start|>user\n",
    assistant_role="<|im_start|>assistant\n",
    separator="<|im_end|>",
)

# InternVL2.5's and InternVL3's default system message, as InternVL's conversation.py defines it for internvl2_5.
INTERNVL2_5_SYSTEM_MESSAGE = "你是书生·万象，英文名是InternVL，是由上海人工智能实验室、清华大学及多家合作单位联合开发的多模态大语言模型。"

# InternVL's published templates (its conversation.py), for original checkpoints that do not ship one.
TEMPLATES: dict[str, ChatTemplate] = {
    "phi3-chat": ChatTemplate(
        name="phi3-chat",
        system_template="<|system|>\n{system_message}",
        user_role="<|user|>\n",
        assistant_role="<|assistant|>\n",
        separator="<|end|>",
    ),
    "internlm2-chat": ChatTemplate(name="internlm2-chat", **_CHATML),
    "Hermes-2": ChatTemplate(name="Hermes-2", **_CHATML),
    "internvl2_5": ChatTemplate(name="internvl2_5", **{**_CHATML, "separator": "<|im_end|>\n"}, default_system_message=INTERNVL2_5_SYSTEM_MESSAGE),
}


def get_template(name: str) -> ChatTemplate:
    if name not in TEMPLATES:
        raise KeyError(f"unknown conversation template {name!r}; known: {', '.join(TEMPLATES)}")
    return TEMPLATES[name]


def template_from_conversation_py(path: Path, name: str) -> ChatTemplate | None:
    """The template `name` as a checkpoint's conversation.py defines it, read as data: the literal arguments
    of its `Conversation(name=<name>, ...)`, those it leaves out InternVL's published template's of that name.
    None when the file does not define it; an InputError for one that is not InternVL's MPT style (another
    layout than the one rendered here), or that leaves out what no published template gives."""
    try:
        tree = ast.parse(read_text(path), filename=str(path))
    except SyntaxError as err:
        raise InputError([Problem(str(path), f"not valid Python at line {err.lineno}: {err.msg}")]) from None
    except (MemoryError, RecursionError):  # Python's parser gives up on nesting this deep
        raise InputError([Problem(str(path), "nested too deeply for Python's parser")]) from None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        kwargs = {kw.arg: kw.value for kw in node.keywords if kw.arg}
        if _literal(kwargs.get("name")) != name:
            continue
        published = TEMPLATES.get(name)
        style = ast.unparse(kwargs["sep_style"]).rsplit(".", 1)[-1] if "sep_style" in kwargs else "MPT" if published else "ADD_COLON_SINGLE"
        if style != "MPT":
            raise InputError([Problem(str(path), f"template {name!r}: separator style {style}; this toolkit renders InternVL's MPT style "
                                                 "(system, then role + message + separator per turn)")])
        given = {key: _literal(kwargs[key]) for key in ("system_template", "system_message", "roles", "sep") if key in kwargs}
        if published is not None:
            given = {"system_template": published.system_template, "system_message": published.default_system_message,
                     "roles": (published.user_role, published.assistant_role), "sep": published.separator} | given
        roles, system_template = given.get("roles"), given.get("system_template", "{system_message}")
        if not (isinstance(roles, tuple) and len(roles) == 2 and all(isinstance(r, str) for r in roles)) or not isinstance(given.get("sep"), str) \
                or not isinstance(system_template, str) or system_template.count("{system_message}") != 1:
            raise InputError([Problem(str(path), f"template {name!r}: roles (two strings), sep and system_template must be string "
                                                 "literals, the system_template holding {system_message} once")])
        message = given.get("system_message", "")
        return ChatTemplate(name, system_template, roles[0], roles[1], given["sep"], message if isinstance(message, str) else "")
    return None


def _literal(node: ast.expr | None) -> object:
    """A literal's value; None for no node or anything that is not a literal."""
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


# Marker texts a Jinja chat template is rendered with, to find its roles and separator.
_SYSTEM, _USER, _ANSWER = "\x00SYSTEM\x00", "\x00USER\x00", "\x00ANSWER\x00"


# What rendering a chat template at load may take: a real one renders a few short turns in milliseconds, a few
# hundred characters. One with nested loops rendered for 200 s and counting; one wrote a 4 GB string.
RENDER_SECONDS = 5.0
RENDER_CHARS = 1_000_000
JINJA_FILENAME = "<template>"  # the file name Jinja compiles a template given as a string under


def within_limits(render, *args):
    """`render(*args)` (a Jinja template's rendering, in this thread), stopped with a ValueError past
    RENDER_SECONDS or once the template's code has written more than RENDER_CHARS characters. The watch is a
    profile hook: it sees every call and return of the template's compiled code (each piece a Jinja
    generator yields is a return), and Jinja caps each `range` at 100,000, so no loop runs long unseen."""
    deadline, written = time.monotonic() + RENDER_SECONDS, 0

    def watch(frame, event, arg) -> None:
        nonlocal written
        if event == "return" and isinstance(arg, str) and frame.f_code.co_filename == JINJA_FILENAME:
            written += len(arg)
            if written > RENDER_CHARS:
                raise ValueError(f"it writes more than {RENDER_CHARS:,} characters for one short turn")
        if time.monotonic() > deadline:
            raise ValueError(f"it takes more than {RENDER_SECONDS:g} s to render one short turn")

    previous = sys.getprofile()
    sys.setprofile(watch)
    try:
        return render(*args)
    finally:
        sys.setprofile(previous)


def _size(value: object, limit: int = RENDER_CHARS) -> int:
    """How many characters `value` writes as text, counted only until past `limit`: a string's length, a
    number's digits, a container's items and its punctuation. Never makes the text itself."""
    total, pending = 0, [value]
    while pending and total <= limit:
        item = pending.pop()
        if isinstance(item, (str, bytes)):
            total += len(item)
        elif type(item) is int:
            total += max(1, int(abs(item).bit_length() * 0.30103) + 1)
        elif isinstance(item, dict):
            total += 2 + 4 * len(item)
            pending += [*item.keys(), *item.values()]
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += 2 + 4 * len(item)
            pending += list(item)
        else:
            total += 24  # a float, None, a boolean, or an object of the sandbox's whose text is its name
    return total


def _number(value: object) -> int:
    return abs(value) if type(value) is int else len(value) if isinstance(value, str) else 0


def _items(value: object) -> int:
    return len(value) if isinstance(value, (str, list, tuple, set, frozenset, dict)) else 0


def _widths(form: object, args: tuple, kwargs: dict) -> int:
    """What the widths and precisions of a printf or str.format text can add: its numbers, and those of the
    arguments where a width is taken from them (`%*d`, `{:{}}`)."""
    if not isinstance(form, str):
        return 0
    taken = "*" in form or re.search(r"\{[^{}]*\{", form) is not None
    return sum(int(d) for d in re.findall(r"\d+", form)) + (sum(map(_number, (*args, *kwargs.values()))) if taken else 0)


def _replaced(text, old="", new="", count=-1, *_) -> int:
    times = _items(text) + 1 if not old else str(text).count(str(old))
    return _size(text) + (min(times, count) if type(count) is int and count >= 0 else times) * _size(new)


def _formatted(form, *args, **kwargs) -> int:
    values = args[0] if len(args) == 1 and isinstance(args[0], (tuple, dict)) else args  # `%`'s right side
    return _size(form) + _size(values) + _size(kwargs) + _widths(form, tuple(values) if isinstance(values, tuple) else (), kwargs)


def _joined(items, separator="", *_, **__) -> int:
    return _size(items) + max(0, _items(items) - 1) * _size(separator)


def _padded(text, width=80, *_, **__) -> int:
    return max(_size(text), _number(width))


# What each growing operation of a template would make, from its arguments, before it makes it: by filter name
# (`'x' | center(4000000000)`), and by str method (`'x'.ljust(4000000000)`). Jinja's other filters and str's other
# methods make at most a few times their input, which is bounded in turn.
GROWTH = {
    "center": _padded, "ljust": _padded, "rjust": _padded, "zfill": _padded,
    "indent": lambda text, width=4, *_, **__: _size(text) + (str(text).count("\n") + 1) * _number(width),
    "expandtabs": lambda text, tabsize=8: _size(text) * max(1, _number(tabsize)),
    "wordwrap": lambda text, width=79, long=True, wrapstring=None, *_, **__: _size(text) * (1 + _size(wrapstring or "\n")),
    "replace": _replaced, "format": _formatted, "format_map": lambda form, values: _formatted(form, values),
    "join": _joined,  # the filter: the items first, then the separator
    "sum": lambda items, attribute=None, start=0: _size(items) + _size(start),
    # transformers' tojson(value, ensure_ascii, indent, ...) or Jinja's tojson(value, indent): an indent per line
    "tojson": lambda value, *args, **kwargs: (6 * _size(value) + 2) * (1 + max(map(_number, (*args[:2], kwargs.get("indent"))))),
    "lipsum": lambda n=5, html=True, low=20, high=100: _number(n) * _number(high) * 12,
}


def _refused(what: str, size: int) -> None:
    if size > RENDER_CHARS:
        raise ValueError(f"an expression of it ({what}) makes a value of more than {RENDER_CHARS:,} characters or digits")


class _BoundedFilters(dict):
    """The environment's filters, each growing one (GROWTH) checked before it runs: looked up by name when a
    template is compiled, those transformers sets after the environment is made (tojson) included."""

    def __getitem__(self, name):
        return _checked(name, super().__getitem__(name))

    def get(self, name, default=None):
        return self[name] if name in self else default


def _checked(name: str, operation):
    if name not in GROWTH:
        return operation

    @functools.wraps(operation)
    def checked(*args, **kwargs):
        _refused(f"| {name}", GROWTH[name](*args[_leading(operation):], **kwargs))
        return operation(*args, **kwargs)

    return checked


def _leading(filter_function) -> int:
    """How many arguments Jinja passes before a filter's value: the environment, context or eval context."""
    return int(getattr(filter_function, "jinja_pass_arg", None) is not None)


class _BoundedCode(CodeGenerator):
    """Jinja's compiler, writing `a ~ b` as a call the sandbox checks: Jinja joins the parts in its own code,
    which within_limits' watch sees only once the text is made."""

    def visit_Concat(self, node, frame) -> None:
        self.write("environment.concatenated((")
        for part in node.nodes:
            self.visit(part, frame)
            self.write(", ")
        self.write("), context.eval_ctx.autoescape)")


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox (transformers renders chat templates in it), in which nothing a template's
    expression makes may be past RENDER_CHARS characters or digits, refused before it is made: `*`, `**`, `+` and
    `%`, `~`, the growing filters and str methods (GROWTH), and what is written out (its finalize). One step of
    Python's own code is what within_limits' watch never sees: `'x' * 4000000000` grew to 10.6 GB. Jinja would
    fold a constant `*` at compile time unless intercepted."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})
    code_generator_class = _BoundedCode

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.filters = _BoundedFilters(self.filters)
        self.finalize = self.written

    @staticmethod
    def written(value):
        _refused("written out", _size(value))
        return value

    @staticmethod
    def concatenated(parts: tuple, autoescape: bool) -> str:
        _refused("~", sum(_size(p) for p in parts))
        return markup_join(parts) if autoescape else str_join(parts)

    def call_binop(self, context, operator: str, left, right):
        if operator == "*" and type(left) is int and not isinstance(right, int):
            left, right = right, left
        if operator == "*" and type(right) is int:
            size = _size(left) * right if isinstance(left, (str, list, tuple)) else _size(left) + _size(right)
        elif operator == "+":
            size = _size(left) + _size(right) if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)) else 0
        elif operator == "**" and type(left) is int and type(right) is int and abs(left) > 1 and right > 0:
            size = right * math.log10(abs(left))  # its digits
        elif operator == "%" and isinstance(left, str):
            size = _formatted(left, right)
        else:
            size = 0
        _refused(operator, size)
        return super().call_binop(context, operator, left, right)

    def wrap_str_format(self, value):
        """str.format and format_map, which Jinja hands out already wrapped in its formatter, checked first."""
        if (wrapped := super().wrap_str_format(value)) is None:
            return None

        def checked(*args, **kwargs):
            _refused(f".{value.__name__}", GROWTH[value.__name__](value.__self__, *args, **kwargs))
            return wrapped(*args, **kwargs)

        return checked

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - Jinja's own signature
        name = getattr(__obj, "__name__", "")
        if isinstance(getattr(__obj, "__self__", None), str) and name in GROWTH:
            _refused(f".{name}", (_joined(args[0], __obj.__self__) if name == "join" else GROWTH[name](__obj.__self__, *args, **kwargs)))
        elif name == "generate_lorem_ipsum":
            _refused("lipsum", GROWTH["lipsum"](*args, **kwargs))
        return super().call(__context, __obj, *args, **kwargs)


@contextmanager
def bounded_sandbox():
    """transformers' apply_chat_template compiling and rendering in _BoundedSandbox. Its compiled templates are
    cached by text: the cache is emptied on entry (a template compiled unbounded is compiled again) and on exit
    (nothing compiled here is reused elsewhere)."""
    from transformers.utils import chat_template_utils

    chat_template_utils._compile_jinja_template.cache_clear()
    original, chat_template_utils.ImmutableSandboxedEnvironment = chat_template_utils.ImmutableSandboxedEnvironment, _BoundedSandbox
    try:
        yield
    finally:
        chat_template_utils.ImmutableSandboxedEnvironment = original
        chat_template_utils._compile_jinja_template.cache_clear()


def template_from_jinja(render, bos_token: str | None, name: str = "chat_template") -> ChatTemplate:
    """A checkpoint's Jinja chat template as a ChatTemplate (module docstring). `render(messages,
    add_generation_prompt)` renders it (the tokenizer's apply_chat_template), within RENDER_SECONDS and
    RENDER_CHARS; a leading `bos_token` is dropped, since the tokenizer adds its own. A ValueError says how the
    template does not fit this layout or these limits."""
    def rendered(messages: list[dict], prompt: bool) -> str:
        text = within_limits(render, messages, prompt)
        return text[len(bos_token):] if bos_token and text.startswith(bos_token) else text

    user, system, answer = ({"role": "user", "content": _USER}, {"role": "system", "content": _SYSTEM},
                            {"role": "assistant", "content": _ANSWER})
    with_system = rendered([system, user], True)
    padded = lambda marker: " \n" + marker + "\n "  # noqa: E731
    spaced = rendered([{"role": "system", "content": padded(_SYSTEM)}, {"role": "user", "content": padded(_USER)}], True)
    if spaced not in (with_system, with_system.replace(_SYSTEM, padded(_SYSTEM)).replace(_USER, padded(_USER))):
        raise ValueError("it changes a message's text otherwise than by stripping the whitespace at its ends")
    trims = spaced == with_system
    answered = rendered([system, user, answer], False)
    alone = rendered([user], True)
    if any(text.count(marker) != 1 for text, marker in ((with_system, _SYSTEM), (with_system, _USER), (alone, _USER), (answered, _ANSWER))):
        raise ValueError("it does not render a system message, a user message and an answer once each as given")
    separator = answered.split(_ANSWER)[1]
    head, rest = with_system.split(_SYSTEM)
    between, after = rest.split(_USER)
    if not separator or not after.startswith(separator) or separator not in between or not answered.startswith(with_system.split(_USER)[0]):
        raise ValueError("its turns are not role + message + one separator (the ChatML layout)")
    # How the template opens an answer it renders: the generation prompt, or more where that prompt opens a block the
    # answer closes first (Qwen3.5's thinking: "<think>\n" there, "<think>\n\n</think>\n\n" before an answer, what it
    # renders with enable_thinking false). The judge is prompted so, and its trained answers follow it as rendered.
    opening = answered.split(_USER)[1][len(separator):].split(_ANSWER)[0]
    if not opening.startswith(after[len(separator):]):
        raise ValueError("it opens an answer otherwise than its generation prompt does")
    tail, user_role = between.split(separator, 1)
    before_user = alone.split(_USER)[0]
    system_turn_end = tail + separator + user_role
    if before_user == user_role:
        default = None
    elif before_user.startswith(head) and before_user.endswith(system_turn_end):
        default = before_user[len(head): len(before_user) - len(system_turn_end)]
    else:
        raise ValueError("without a system message it renders another layout than with one")
    return ChatTemplate(name, head + "{system_message}" + tail, user_role, opening, separator, default, trims)
