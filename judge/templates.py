"""Conversation templates of the InternVL2 family, rendered the way InternVL's `model.chat` renders them.

All three use InternVL's "MPT" separator style: system, then each turn as role + message + separator,
with no newline between turns, and the final assistant role left open for the model to continue:

    phi3-chat       <|system|>\n{system}<|end|><|user|>\n{query}<|end|><|assistant|>\n
    internlm2-chat  <|im_start|>system\n{system}<|im_end|><|im_start|>user\n{query}<|im_end|><|im_start|>assistant\n
    Hermes-2        (the same ChatML layout as internlm2-chat)

The model stops at the separator token (`<|end|>` or `<|im_end|>`), which is also the token a trained
target ends with. The system message comes from the checkpoint when it carries one (config.json's
`system_message`, or its own `conversation.py` read with `ast`, never executed); otherwise it is
InternVL's default below.

A rendered turn is also known as parts (`ChatTemplate.parts`): the template's own strings, whose control
tokens are the only ones the turn may hold, and the text it frames (system message, query), which is
read as text whatever it says (mmjudge.judge.prompts.encode_prompt).
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path

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


# InternVL2's default system message, as its conversation.py defines it for these templates.
INTERNVL_SYSTEM_MESSAGE = "你是由上海人工智能实验室联合商汤科技开发的书生多模态大模型，英文名叫InternVL, 是一个有用无害的人工智能助手。"


@dataclass(frozen=True)
class ChatTemplate:
    name: str
    system_template: str  # contains {system_message}
    user_role: str
    assistant_role: str
    separator: str
    default_system_message: str = INTERNVL_SYSTEM_MESSAGE

    def render(self, query: str, system_message: str | None = None) -> str:
        """The prompt for one user turn, ending where the assistant's answer begins."""
        return "".join(text for text, _ in self.parts([(query, False)], system_message))

    def parts(self, query: list[Part], system_message: str | None = None) -> list[Part]:
        """`render`'s turn in parts around a query given in parts (its image tokens are the prompt's own)."""
        head, tail = self.system_template.split("{system_message}")
        system = self.default_system_message if system_message is None else system_message
        return [(head, True), (system, False), (tail + self.separator + self.user_role, True), *query,
                (self.separator + self.assistant_role, True)]

    def target(self, answer: str) -> str:
        """What a trained judge must produce after `render`: the answer and the stop separator."""
        return "".join(text for text, _ in self.target_parts(answer))

    def target_parts(self, answer: str) -> list[Part]:
        return [(answer, False), (self.separator, True)]

    @property
    def stop_token(self) -> str:
        return self.separator.strip()

    def jinja(self, system_message: str | None = None) -> str:
        """This template as a Jinja chat template, for a server that renders its own (vLLM's
        `--chat-template`): for a user message after at most one system message, `render`'s text, after
        the tokenizer's BOS, which the local judge's tokenizer adds and vLLM adds to a rendered chat only
        when the template does. Every literal is a quoted string, so that Jinja's whitespace rules cannot
        touch it."""
        quoted = lambda text: "{{ " + json.dumps(text) + " }}"  # noqa: E731 - JSON's escapes are Jinja's too
        system_before, _, system_after = self.system_template.partition("{system_message}")
        default = self.default_system_message if system_message is None else system_message
        return ("{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
                "{% else %}{% set system = " + json.dumps(default) + " %}{% endif %}"
                "{{ bos_token }}" + quoted(system_before) + "{{ system }}" + quoted(system_after + self.separator + self.user_role)
                + "{{ messages[-1]['content'] }}" + quoted(self.separator + self.assistant_role))


_CHATML = dict(
    system_template="<|im_start|>system\n{system_message}",
    user_role="<|im_start|>user\n",
    assistant_role="<|im_start|>assistant\n",
    separator="<|im_end|>",
)

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
}


def get_template(name: str) -> ChatTemplate:
    if name not in TEMPLATES:
        raise KeyError(f"unknown conversation template {name!r}; known: {', '.join(TEMPLATES)}")
    return TEMPLATES[name]


def system_message_from_conversation_py(path: Path, template: str) -> str | None:
    """The system_message that a checkpoint's conversation.py gives `template`, read as data.

    Looks for `Conversation(name=<template>, system_message=<literal>, ...)`; None when the file has no
    such literal (then the caller falls back to the template's default)."""
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
        name, message = kwargs.get("name"), kwargs.get("system_message")
        if name is None or message is None:
            continue
        try:
            if ast.literal_eval(name) == template:
                value = ast.literal_eval(message)
                return value if isinstance(value, str) else None
        except ValueError:
            continue
    return None
