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


# One template per operation that grows a value in one step of Python's own code, which within_limits' watch never
# sees (issue 56: `~` in a loop was bounded only once written out): each is refused before it makes the value.
GROWING = {
    "~": "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
    "| join": "{% set a = 'x' * 999999 %}{{ [a, a, a, a, a, a, a, a] | join | length }}",
    ".join": "{{ ('y' * 999999).join('x' * 999999) | length }}",
    "| format": "{% set a = 'x' * 999999 %}{{ '%s%s%s%s%s%s%s%s' | format(a, a, a, a, a, a, a, a) | length }}",
    "%": "{{ ('%*d' % (4000000000, 1)) | length }}",
    ".format": "{{ '{:>4000000000}'.format('x') | length }}",
    "| replace": "{{ ('x' * 999999) | replace('x', 'y' * 999999) | length }}",
    ".replace": "{{ ('x' * 999999).replace('x', 'y' * 999999) | length }}",
    "| center": "{{ 'x' | center(4000000000) | length }}",
    ".ljust": "{{ 'x'.ljust(4000000000) | length }}",
    "| indent": "{{ 'x' | indent(4000000000, true) | length }}",
    "| sum": "{% set row = [0] * 99999 %}{{ [row, row, row] | sum(start=[]) | length }}",
    "| tojson": "{{ [[[[[[[[1]]]]]]]] | tojson(indent=400000000) | length }}",
    "*": "{% set a = 'x' * 999999 %}{{ [a] * 999999 }}",
    "written out": "{% set a = 'x' * 999999 %}{{ [a, a, a, a, a, a, a, a] }}",
}

# Each rendered as transformers renders a checkpoint's template at load (templates.bounded_sandbox), in a process of
# its own limited to 2 GiB of address space and 60 s: the code before the fix grew them until MemoryError.
RENDER = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))
from transformers.utils import chat_template_utils
from mmjudge.judge.templates import bounded_sandbox, within_limits
said = {}
for name, text in json.loads(sys.argv[1]).items():
    try:
        with bounded_sandbox():
            template = chat_template_utils._compile_jinja_template(text)
        said[name] = "rendered: " + within_limits(lambda: template.render(messages=[], add_generation_prompt=True))[:100]
    except Exception as err:
        said[name] = f"{type(err).__name__}: {err}"
print(json.dumps(said))
"""


@pytest.fixture(scope="module")
def growing_rendered():
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", RENDER, json.dumps(GROWING)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("operation", list(GROWING))
def test_a_growing_operation_of_a_chat_template_is_refused_before_it_makes_the_value(growing_rendered, operation):
    assert growing_rendered[operation] == (f"ValueError: an expression of it ({operation}) makes a value of more than 1,000,000 "
                                           "characters or digits")


def test_the_bounded_operations_render_as_jinja_renders_them():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from mmjudge.judge.templates import _BoundedSandbox

    text = ("{% set ns = namespace(s='ab') %}{% for i in range(3) %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.s }}|{{ 'x' | center(7) }}|"
            "{{ [1, 2] | join(', ') }}|{{ '%05d' % 42 }}|{{ '{:>4}'.format('a') }}|{{ 'a b' | replace(' ', '_') }}|{{ 'q'.ljust(3) }}|"
            "{{ 'x\ny' | indent(2, true) }}|{{ [[1], [2]] | sum(start=[]) }}|{{ '%s=%s' | format('k', 3) }}|{{ [0] * 3 }}|{{ '{a}'.format_map({'a': 1}) }}")
    assert _BoundedSandbox().from_string(text).render() == ImmutableSandboxedEnvironment().from_string(text).render()
