"""The three conversation templates, pinned to the strings InternVL's conversation.py (MPT separator
style) renders for one user turn."""

import pytest

from mmjudge.judge.templates import INTERNVL_SYSTEM_MESSAGE, TEMPLATES, get_template

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


@pytest.mark.parametrize("name", list(TEMPLATES))
@pytest.mark.parametrize("system", [None, "You are a strict judge.\n"])
def test_the_jinja_form_renders_what_render_does_after_the_bos_token(tmp_path_factory, name, system):
    """What a server given `--chat-template` renders (as transformers and vLLM apply a Jinja chat template),
    and the token ids it makes of it without adding special tokens, as vLLM does: the local judge's."""
    from mmjudge.judge.testing import write_tokenizer

    tokenizer = write_tokenizer(tmp_path_factory.mktemp("tok"))
    template = TEMPLATES[name]
    query = 'Image-0: <image>\nQuestion: "{{ x }}" {% raw %}\n\nAnswer:  two  spaces\n'
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": query}]
    rendered = tokenizer.apply_chat_template(messages, chat_template=template.jinja(), tokenize=False, add_generation_prompt=True)
    assert rendered == tokenizer.bos_token + template.render(query, system)
    if name == "phi3-chat":  # the tiny tokenizer is InternVL2-4B's look-alike: the ChatML roles are no special tokens in it
        assert tokenizer(rendered, add_special_tokens=False).input_ids == tokenizer(template.render(query, system)).input_ids
