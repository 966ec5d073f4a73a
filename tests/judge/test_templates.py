"""The three conversation templates, pinned to the strings InternVL's conversation.py (MPT separator
style) renders for one user turn, and the layering rule of the core package."""

import ast
from pathlib import Path

import pytest

from judge.templates import INTERNVL_SYSTEM_MESSAGE, get_template

CHATML = "<|im_start|>system\nSYS<|im_end|><|im_start|>user\nQ?<|im_end|><|im_start|>assistant\n"


@pytest.mark.parametrize("name, rendered, stop", [
    ("phi3-chat", "<|system|>\nSYS<|end|><|user|>\nQ?<|end|><|assistant|>\n", "<|end|>"),
    ("internlm2-chat", CHATML, "<|im_end|>"),
    ("Hermes-2", CHATML, "<|im_end|>"),
])
def test_templates_render_as_internvl_does(name, rendered, stop):
    template = get_template(name)
    assert template.render("Q?", "SYS") == rendered
    assert template.stop_token == stop and template.target("### Score\n4") == "### Score\n4" + stop
    assert template.render("Q?").startswith(rendered.split("SYS")[0] + INTERNVL_SYSTEM_MESSAGE)  # InternVL's default


def test_unknown_template_is_named():
    with pytest.raises(KeyError, match="unknown conversation template 'vicuna'; known: phi3-chat, internlm2-chat, Hermes-2"):
        get_template("vicuna")


def test_core_package_imports_no_command_package():
    """judge/ is what every command shares; it must not depend on any of them."""
    commands = {"infer", "train", "calibration", "demo"}
    offenders = []
    for path in Path(__file__).resolve().parents[2].joinpath("judge").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in commands]
    assert offenders == []
