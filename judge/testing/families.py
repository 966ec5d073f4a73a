"""Tiny random checkpoints of every supported backbone family, each in its family's released layout: the real
model's config.json with the sizes shrunk, its tokenizer files' rules, its processor config, its weights' key
names and dtype layout.

    family           layout    language model                       tokenizer                          template
    internvl2-4b     original  Phi-3 (long rope)                    SentencePiece, Llama's rules        phi3-chat
    internvl2-1b     original  Qwen2                                byte-level BPE, Qwen2's             Hermes-2
    internvl2-8b     original  InternLM2 (GQA, fused wqkv, dynamic  SentencePiece, InternLM2's          internlm2-chat
                               NTK rope)                            (remote-code class)
    internvl2.5-8b   original  InternLM2.5                          as internvl2-8b                     internvl2_5
    internvl3-2b     original  Qwen2.5                              byte-level BPE, Qwen2.5's           internvl2_5
    internvl3-1b-hf  native    Qwen2.5, tied embeddings             Qwen2.5-VL's + InternVL's tokens    its Jinja (no system)
    qwen2.5-vl-3b    native    Qwen2.5-VL, tied embeddings          Qwen2.5-VL's                        its Jinja
    qwen2.5-vl-7b    native    Qwen2.5-VL                           Qwen2.5-VL's                        its Jinja
    qwen3-vl-4b      native    Qwen3-VL, tied embeddings, DeepStack Qwen3-VL's                          its Jinja (no system)
    qwen3-vl-8b      native    Qwen3-VL, DeepStack                  Qwen3-VL's                          its Jinja (no system)
    qwen3.5-4b       native    Qwen3.5 (Gated DeltaNet x 3, gated   Qwen3.5's (its own split rule)      its Jinja (thinking;
                               attention x 1), tied, MTP weights                                        no system)
    qwen3.5-9b       native    Qwen3.5, MTP weights                 Qwen3.5's                           its Jinja
    qwen3.5-35b-a3b  native    Qwen3.5 MoE (routed experts stored   Qwen3.5's                           its Jinja
                               one by one, a shared expert), MTP

The original layouts (InternVLChatModel) are written tensor by tensor under InternVL's own names, so the loader's
conversion is tested against files it did not write; the native ones are transformers' own models saved by
transformers (which writes the released key layout), with the released config.json written over its own.
Every weight is random, biases and norms included (a mapping that drops or swaps one changes the output), and
stored in float32 so that parity checks can be exact. Special tokens keep their released order and their
offsets above the base vocabulary (Qwen's <|im_end|> is base + 2, <|image_pad|> base + 12, as 151645 and
151655 are 151643 + 2 and + 12).

`python -m mmjudge.judge.testing checkpoint --family NAME OUT_DIR` writes one.
"""

from __future__ import annotations

import functools
import io
import json
from pathlib import Path

import sentencepiece as spm
import torch
from safetensors.torch import load_file, save_file
from sentencepiece import sentencepiece_model_pb2

from mmjudge.judge.testing.checkpoints import SIZES, _corpus, _original_weights, _save_shards, _write_json, internvl_chat_config, write_tokenizer
from mmjudge.judge.testing.family_table import DEFAULT_SWITCH, FAMILIES, Family
from mmjudge.judge.tiling import IMAGE_TOKENS

INTERNVL_TOKENS = (*IMAGE_TOKENS, "<quad>", "</quad>", "<ref>", "</ref>", "<box>", "</box>")
# Qwen2.5's added tokens in their released order (151643...); Qwen3 adds four more, Qwen2 has the first three.
QWEN_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
               "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
               "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")
QWEN3_TOKENS = (*QWEN_TOKENS, "<tool_response>", "</tool_response>", "<think>", "</think>")
QWEN_NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>",
                    "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>"}
# InternLM2's added tokens, which its SentencePiece model holds as placeholder pieces at the top of its vocabulary.
INTERNLM2_TOKENS = ("<|plugin|>", "<|interpreter|>", "<|action_end|>", "<|action_start|>", "<|im_end|>", "<|im_start|>")
INTERNLM2_CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                           "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# The chat templates as released: Qwen2.5-VL's (chat_template.json), InternVL's -hf converter's, and Qwen3-VL's
# for the parts a judge's one user turn reaches (text and images, an optional system turn, no tools).
QWEN2_5_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
INTERNVL_HF_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' %}{{ '<IMG_CONTEXT>\n' }}"
    "{% elif content['type'] == 'video' %}{{ '<video>\n' }}{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{'<|im_end|>\n'}}{% endfor %}{% if add_generation_prompt %}{{'<|im_start|>assistant\n' }}{% endif %}")
QWEN3_VL_CHAT_TEMPLATE = (
    "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\n' }}{%- if messages[0].content is string %}"
    "{{- messages[0].content }}{%- else %}{%- for content in messages[0].content %}{%- if 'text' in content %}{{- content.text }}"
    "{%- endif %}{%- endfor %}{%- endif %}{{- '<|im_end|>\n' }}{%- endif %}"
    "{%- set image_count = namespace(value=0) %}{%- set video_count = namespace(value=0) %}"
    "{%- for message in messages %}{%- if message.role == 'user' or message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role + '\n' }}{%- if message.content is string %}{{- message.content }}{%- else %}"
    "{%- for content in message.content %}{%- if content.type == 'image' or 'image' in content or 'image_url' in content %}"
    "{%- set image_count.value = image_count.value + 1 %}{%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}"
    "<|vision_start|><|image_pad|><|vision_end|>{%- elif content.type == 'video' or 'video' in content %}"
    "{%- set video_count.value = video_count.value + 1 %}{%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}"
    "<|vision_start|><|video_pad|><|vision_end|>{%- elif 'text' in content %}{{- content.text }}{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\n' }}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}")


# Qwen3.5's chat template as released (chat_template.jinja), tools and all: a judge's turn reaches its text, image,
# system and thinking parts. Its generation prompt opens a thinking block unless enable_thinking is false.
QWEN3_5_CHAT_TEMPLATE = """{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- macro render_content(content, do_vision_count, is_system_content=false) %}
    {%- if content is string %}
        {{- content }}
    {%- elif content is iterable and content is not mapping %}
        {%- for item in content %}
            {%- if 'image' in item or 'image_url' in item or item.type == 'image' %}
                {%- if is_system_content %}
                    {{- raise_exception('System message cannot contain images.') }}
                {%- endif %}
                {%- if do_vision_count %}
                    {%- set image_count.value = image_count.value + 1 %}
                {%- endif %}
                {%- if add_vision_id %}
                    {{- 'Picture ' ~ image_count.value ~ ': ' }}
                {%- endif %}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' }}
            {%- elif 'video' in item or item.type == 'video' %}
                {%- if is_system_content %}
                    {{- raise_exception('System message cannot contain videos.') }}
                {%- endif %}
                {%- if do_vision_count %}
                    {%- set video_count.value = video_count.value + 1 %}
                {%- endif %}
                {%- if add_vision_id %}
                    {{- 'Video ' ~ video_count.value ~ ': ' }}
                {%- endif %}
                {{- '<|vision_start|><|video_pad|><|vision_end|>' }}
            {%- elif 'text' in item %}
                {{- item.text }}
            {%- else %}
                {{- raise_exception('Unexpected item type in content.') }}
            {%- endif %}
        {%- endfor %}
    {%- elif content is none or content is undefined %}
        {{- '' }}
    {%- else %}
        {{- raise_exception('Unexpected content type.') }}
    {%- endif %}
{%- endmacro %}
{%- if not messages %}
    {{- raise_exception('No messages provided.') }}
{%- endif %}
{%- if tools and tools is iterable and tools is not mapping %}
    {{- '<|im_start|>system\n' }}
    {{- "# Tools\n\nYou have access to the following functions:\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>" }}
    {{- '\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>' }}
    {%- if messages[0].role == 'system' %}
        {%- set content = render_content(messages[0].content, false, true)|trim %}
        {%- if content %}
            {{- '\n\n' + content }}
        {%- endif %}
    {%- endif %}
    {{- '<|im_end|>\n' }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {%- set content = render_content(messages[0].content, false, true)|trim %}
        {{- '<|im_start|>system\n' + content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" %}
        {%- set content = render_content(message.content, false)|trim %}
        {%- if not(content.startswith('<tool_response>') and content.endswith('</tool_response>')) %}
            {%- set ns.multi_step_tool = false %}
            {%- set ns.last_query_index = index %}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if ns.multi_step_tool %}
    {{- raise_exception('No user query found in messages.') }}
{%- endif %}
{%- for message in messages %}
    {%- set content = render_content(message.content, true)|trim %}
    {%- if message.role == "system" %}
        {%- if not loop.first %}
            {{- raise_exception('System message must be at the beginning.') }}
        {%- endif %}
    {%- elif message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- set reasoning_content = reasoning_content|trim %}
        {%- if loop.index0 > ns.last_query_index %}
            {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content + '\n</think>\n\n' + content }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls and message.tool_calls is iterable and message.tool_calls is not mapping %}
            {%- for tool_call in message.tool_calls %}
                {%- if tool_call.function is defined %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {%- if loop.first %}
                    {%- if content|trim %}
                        {{- '\n\n<tool_call>\n<function=' + tool_call.name + '>\n' }}
                    {%- else %}
                        {{- '<tool_call>\n<function=' + tool_call.name + '>\n' }}
                    {%- endif %}
                {%- else %}
                    {{- '\n<tool_call>\n<function=' + tool_call.name + '>\n' }}
                {%- endif %}
                {%- if tool_call.arguments is defined %}
                    {%- for args_name, args_value in tool_call.arguments|items %}
                        {{- '<parameter=' + args_name + '>\n' }}
                        {%- set args_value = args_value | string if args_value is string else args_value | tojson | safe %}
                        {{- args_value }}
                        {{- '\n</parameter>\n' }}
                    {%- endfor %}
                {%- endif %}
                {{- '</function>\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.previtem and loop.previtem.role != "tool" %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if not loop.last and loop.nextitem.role != "tool" %}
            {{- '<|im_end|>\n' }}
        {%- elif loop.last %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('Unexpected message role.') }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- else %}
        {{- '<think>\n' }}
    {%- endif %}
{%- endif %}"""


def write_family_checkpoint(name: str, out_dir: str | Path, *, seed: int = 0, rope_switch: int = DEFAULT_SWITCH) -> Path:
    """A tiny checkpoint of the family `name` (FAMILIES) in its released layout."""
    family = FAMILIES[name]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if name == "internvl2-4b":
        from mmjudge.judge.testing.checkpoints import write_original_checkpoint

        return write_original_checkpoint(out_dir, seed=seed, original_max_position_embeddings=rope_switch)
    tokens = write_family_tokenizer(family, out_dir)
    if family.layout == "original":
        _write_original(family, out_dir, tokens, seed, rope_switch)
    else:
        _write_native(family, out_dir, tokens, seed)
    return out_dir


def write_reward_checkpoint(out_dir: str | Path, *, family: str = "qwen2.5-vl-3b", seed: int = 0) -> Path:
    """A tiny reward model (judge/reward_model.py: a linear head, as judge-train --objective bradley_terry saves
    it) over the family's tiny checkpoint, its head drawn wide (std 1) so that answers' rewards lie well apart."""
    from mmjudge.judge.model import Judge, load_judge, save_native
    from mmjudge.judge.reward_model import reward_classifier

    out_dir = Path(out_dir)
    judge = load_judge(write_family_checkpoint(family, out_dir / "base", seed=seed))
    model = reward_classifier(judge.model, judge.pad_id, "linear")
    with torch.no_grad():
        model.score.weight.copy_(torch.randn(model.score.weight.shape, generator=torch.Generator().manual_seed(seed)))
    save_native(Judge(model, judge.tokenizer, judge.settings, "training"), out_dir / "reward")
    return out_dir / "reward"


# -- tokenizers -----------------------------------------------------------------------------------------------------

def write_family_tokenizer(family: Family, out_dir: Path) -> dict[str, int]:
    """The family's tokenizer files; returns its special tokens' ids."""
    if family.tokenizer == "llama-sp":
        tokenizer = write_tokenizer(out_dir)
        return {t: tokenizer.convert_tokens_to_ids(t) for t in INTERNVL_TOKENS}
    if family.tokenizer == "internlm2-sp":
        return _write_internlm2_tokenizer(out_dir)
    released = {"qwen2": QWEN_TOKENS[:3], "qwen2.5": QWEN_TOKENS, "qwen3": QWEN3_TOKENS, "qwen3.5": QWEN3_TOKENS}[family.tokenizer]
    internvl = (*INTERNVL_TOKENS, *("<video>",) * (family.llm == "internvl")) if family.llm in ("qwen2", "internvl") else ()
    return _write_qwen_tokenizer(out_dir, released, internvl, family)


@functools.cache
def _internlm2_model() -> bytes:
    """A SentencePiece BPE model with InternLM2's options (byte fallback, a dummy word-start prefix), and its six
    placeholder pieces at the top of the vocabulary, as InternLM2's tokenizer.model holds them."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_corpus(1)), model_writer=model, vocab_size=SIZES.base_vocab - len(INTERNLM2_TOKENS), model_type="bpe",
        byte_fallback=True, split_digits=True, character_coverage=1.0, num_threads=1, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        add_dummy_prefix=True, remove_extra_whitespaces=False, allow_whitespace_only_pieces=True, normalization_rule_name="identity",
        minloglevel=2)
    proto = sentencepiece_model_pb2.ModelProto.FromString(model.getvalue())
    for k in range(len(INTERNLM2_TOKENS)):
        piece = proto.pieces.add()
        piece.piece, piece.score, piece.type = f"[UNUSED_TOKEN_{141 + k}]", 0.0, sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
    return proto.SerializeToString()


def _write_internlm2_tokenizer(out_dir: Path) -> dict[str, int]:
    (out_dir / "tokenizer.model").write_bytes(_internlm2_model())
    base = SIZES.base_vocab  # the SentencePiece vocabulary, the placeholders included
    ids = {t: base - len(INTERNLM2_TOKENS) + k for k, t in enumerate(INTERNLM2_TOKENS)} | {t: base + k for k, t in enumerate(INTERNVL_TOKENS)}
    flags = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
    decoder = {"0": {"content": "<unk>", **flags}, "1": {"content": "<s>", **flags}, "2": {"content": "</s>", **flags}}
    decoder |= {str(i): {"content": t, **flags} for t, i in ids.items()}
    config = {
        "add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": decoder,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|action_start|>", "<|action_end|>", "<|interpreter|>", "<|plugin|>"],
        "auto_map": {"AutoTokenizer": ["tokenization_internlm2.InternLM2Tokenizer", "tokenization_internlm2_fast.InternLM2TokenizerFast"]},
        "bos_token": "<s>", "chat_template": INTERNLM2_CHAT_TEMPLATE, "clean_up_tokenization_spaces": False, "decode_with_prefix_space": False,
        "eos_token": "</s>", "model_max_length": 1000000000000000019884624838656, "pad_token": "</s>", "sp_model_kwargs": None,
        "tokenizer_class": "InternLM2Tokenizer", "unk_token": "<unk>",
    }
    _write_json(out_dir / "tokenizer_config.json", config)
    _write_json(out_dir / "special_tokens_map.json", {"additional_special_tokens": config["additional_special_tokens"], "bos_token": "<s>",
                                                      "eos_token": "</s>", "pad_token": "</s>", "unk_token": "<unk>"})
    return {"<s>": 1, "</s>": 2, **ids}


# Qwen2's pre-tokenizer split, as its tokenizer.json and the slow Qwen2Tokenizer's PRETOKENIZE_REGEX give it.
QWEN_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
# Qwen3.5's (its tokenizer.json, transformers' Qwen3_5Tokenizer): a word also holds its combining marks (\p{M}).
QWEN3_5_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


@functools.cache
def _qwen_bpe() -> tuple[dict[str, int], list[str]]:
    """A byte-level BPE vocabulary and its merges, trained here on the fixed corpus with Qwen2's normalizer (NFC)
    and pre-tokenizer; the 256 byte symbols first, as in Qwen's vocab.json."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
                                                       pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=SIZES.base_vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(_corpus(2), trainer)
    saved = json.loads(tokenizer.to_str())["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in saved["merges"]]
    return dict(sorted(saved["vocab"].items(), key=lambda item: item[1])), merges


def _write_qwen_tokenizer(out_dir: Path, released: tuple[str, ...], internvl: tuple[str, ...], family: Family) -> dict[str, int]:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab, merges = _qwen_bpe()
    base = len(vocab)
    ids = {t: base + k for k, t in enumerate((*released, *internvl))}
    special = {t for t in (*released, *internvl) if t not in QWEN_NOT_SPECIAL}
    (out_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out_dir / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges], byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    split = QWEN3_5_SPLIT if family.tokenizer == "qwen3.5" else QWEN_SPLIT
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
                                                       pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_tokens([AddedToken(t, special=t in special, normalized=False) for t in ids])
    tokenizer.save(str(out_dir / "tokenizer.json"))
    flags = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
    config = {
        "add_bos_token": False, "add_prefix_space": False,
        "added_tokens_decoder": {str(i): {"content": t, **flags, "special": t in special} for t, i in ids.items()},
        "additional_special_tokens": [t for t in (*released[1:], *internvl) if t in special],
        "bos_token": None, "clean_up_tokenization_spaces": False, "errors": "replace", "model_max_length": 131072,
        "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
        "eos_token": "<|endoftext|>" if family.tokenizer == "qwen2" else "<|im_end|>", "pad_token": "<|endoftext|>",
    }
    if family.llm == "qwen2_5_vl":
        (out_dir / "chat_template.json").write_text(json.dumps({"chat_template": QWEN2_5_VL_CHAT_TEMPLATE}, indent=2) + "\n")
        config["chat_template"] = QWEN2_5_VL_CHAT_TEMPLATE
    elif family.llm == "qwen3_vl":
        (out_dir / "chat_template.json").write_text(json.dumps({"chat_template": QWEN3_VL_CHAT_TEMPLATE}, indent=2) + "\n")
        config["chat_template"] = QWEN3_VL_CHAT_TEMPLATE
    elif family.tokenizer == "qwen3.5":
        (out_dir / "chat_template.jinja").write_text(QWEN3_5_CHAT_TEMPLATE)
    elif family.llm == "internvl":
        (out_dir / "chat_template.jinja").write_text(INTERNVL_HF_CHAT_TEMPLATE)
        config |= {"chat_template": INTERNVL_HF_CHAT_TEMPLATE, "context_image_token": "<IMG_CONTEXT>", "end_image_token": "</img>",
                   "start_image_token": "<img>", "video_token": "<video>",
                   "extra_special_tokens": {"context_image_token": "<IMG_CONTEXT>", "end_image_token": "</img>", "start_image_token": "<img>",
                                            "video_token": "<video>"}}
    _write_json(out_dir / "tokenizer_config.json", config)
    return ids


# -- original (InternVLChatModel) checkpoints ---------------------------------------------------------------------------

def _llm_config(family: Family, tokens: dict[str, int], rope_switch: int) -> dict:
    s = SIZES
    vocab = -(-(max(tokens.values()) + 1) // 64) * 64
    common = {"hidden_size": s.llm_hidden, "num_hidden_layers": s.llm_layers, "num_attention_heads": s.llm_heads,
              "num_key_value_heads": family.kv_heads or s.llm_heads, "intermediate_size": s.llm_intermediate, "vocab_size": vocab, "hidden_act": "silu",
              "rms_norm_eps": 1e-6, "initializer_range": 0.02, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True}
    if family.llm == "internlm2":
        return {"architectures": ["InternLM2ForCausalLM"], "model_type": "internlm2",
                "auto_map": {"AutoConfig": "configuration_internlm2.InternLM2Config", "AutoModel": "modeling_internlm2.InternLM2ForCausalLM",
                             "AutoModelForCausalLM": "modeling_internlm2.InternLM2ForCausalLM"},
                **common, "bias": False, "max_position_embeddings": rope_switch, "rope_scaling": {"type": "dynamic", "factor": 2.0},
                "rope_theta": 1000000, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "attn_implementation": "eager"}
    return {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", **common, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
            "sliding_window": 32768, "max_window_layers": 21, "use_sliding_window": False, "attention_dropout": 0.0,
            "bos_token_id": tokens.get("<|endoftext|>"), "eos_token_id": tokens["<|im_end|>"]}


def _llm_weights(family: Family, config: dict, seed: int) -> dict[str, torch.Tensor]:
    """Random tensors under the original language model's names and shapes (Qwen2's, or InternLM2's own)."""
    g = torch.Generator().manual_seed(seed + 1)
    normal = lambda *shape, std=0.02: torch.randn(*shape, generator=g) * std  # noqa: E731
    near_one = lambda n: 1 + normal(n, std=0.1)  # noqa: E731
    h, layers, inter, vocab = config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"], config["vocab_size"]
    d = h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    if family.llm == "internlm2":
        w = {"language_model.model.tok_embeddings.weight": normal(vocab, h), "language_model.model.norm.weight": near_one(h),
             "language_model.output.weight": normal(vocab, h)}
        for i in range(layers):
            pre = f"language_model.model.layers.{i}."
            w |= {pre + "attention.wqkv.weight": normal(q + 2 * kv, h), pre + "attention.wo.weight": normal(h, q),
                  pre + "feed_forward.w1.weight": normal(inter, h), pre + "feed_forward.w3.weight": normal(inter, h),
                  pre + "feed_forward.w2.weight": normal(h, inter), pre + "attention_norm.weight": near_one(h), pre + "ffn_norm.weight": near_one(h)}
        return w
    w = {"language_model.model.embed_tokens.weight": normal(vocab, h), "language_model.model.norm.weight": near_one(h),
         "language_model.lm_head.weight": normal(vocab, h)}
    for i in range(layers):
        pre = f"language_model.model.layers.{i}."
        w |= {pre + "self_attn.q_proj.weight": normal(q, h), pre + "self_attn.q_proj.bias": normal(q),
              pre + "self_attn.k_proj.weight": normal(kv, h), pre + "self_attn.k_proj.bias": normal(kv),
              pre + "self_attn.v_proj.weight": normal(kv, h), pre + "self_attn.v_proj.bias": normal(kv),
              pre + "self_attn.o_proj.weight": normal(h, q), pre + "mlp.gate_proj.weight": normal(inter, h),
              pre + "mlp.up_proj.weight": normal(inter, h), pre + "mlp.down_proj.weight": normal(h, inter),
              pre + "input_layernorm.weight": near_one(h), pre + "post_attention_layernorm.weight": near_one(h)}
    return w


CONVERSATION_PY = """# The conversation templates this checkpoint's remote code registers (InternVL's conversation.py, the entries it uses).
register_conv_template(
    Conversation(
        name={name!r},
        system_template={system_template!r},
        system_message={system_message!r},
        roles={roles!r},
        sep_style=SeparatorStyle.MPT,
        sep={sep!r},
    )
)
"""


def _write_original(family: Family, out_dir: Path, tokens: dict[str, int], seed: int, rope_switch: int) -> None:
    from mmjudge.judge.templates import TEMPLATES

    config = internvl_chat_config(_llm_config(family, tokens, rope_switch), family.template)
    _write_json(out_dir / "config.json", config)
    stop = tokens["<|im_end|>"]
    eos = [tokens["</s>"], stop] if family.llm == "internlm2" else [tokens["<|endoftext|>"], stop]
    _write_json(out_dir / "generation_config.json", {"eos_token_id": eos})
    template = TEMPLATES[family.template]
    (out_dir / "conversation.py").write_text(CONVERSATION_PY.format(
        name=template.name, system_template=template.system_template, system_message=template.default_system_message,
        roles=(template.user_role, template.assistant_role), sep=template.separator), encoding="utf-8")
    vision = {k: v for k, v in _original_weights(seed).items() if not k.startswith("language_model.")}
    weights = vision | _llm_weights(family, config["llm_config"], seed)
    _save_shards(out_dir, {k: t.contiguous() for k, t in weights.items()}, 1)


# -- native checkpoints (-hf InternVL, Qwen-VL) ---------------------------------------------------------------------

QWEN_MEAN, QWEN_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]


def _native_config(family: Family, tokens: dict[str, int]) -> dict:
    s = SIZES
    vocab = -(-(max(tokens.values()) + 1) // 64) * 64
    heads, d = s.llm_heads, s.llm_hidden // s.llm_heads
    text = {"hidden_size": s.llm_hidden, "intermediate_size": s.llm_intermediate, "num_hidden_layers": s.llm_layers,
            "num_attention_heads": heads, "num_key_value_heads": family.kv_heads or s.llm_heads, "vocab_size": vocab, "hidden_act": "silu",
            "rms_norm_eps": 1e-6, "initializer_range": 0.02, "attention_dropout": 0.0, "use_cache": True,
            "bos_token_id": tokens["<|endoftext|>"], "eos_token_id": tokens["<|im_end|>"]}
    if family.llm == "internvl":
        vision = {"architectures": ["InternVisionModel"], "model_type": "internvl_vision", "hidden_size": s.vision_hidden,
                  "num_hidden_layers": s.vision_layers, "num_attention_heads": s.vision_heads, "intermediate_size": s.vision_intermediate,
                  "image_size": [s.image_size, s.image_size], "patch_size": [s.patch_size, s.patch_size], "num_channels": 3,
                  "attention_bias": True, "use_qk_norm": False, "hidden_act": "gelu", "layer_norm_eps": 1e-6, "layer_scale_init_value": 0.1,
                  "norm_type": "layer_norm", "use_mean_pooling": True, "use_absolute_position_embeddings": True,
                  "attention_dropout": 0.0, "projection_dropout": 0.0, "hidden_dropout_prob": 0.0, "initializer_range": 1e-10}
        return {"architectures": ["InternVLForConditionalGeneration"], "model_type": "internvl", "downsample_ratio": 0.5,
                "image_seq_length": s.tokens_per_tile, "image_token_id": tokens["<IMG_CONTEXT>"], "projector_hidden_act": "gelu",
                "vision_feature_layer": -1, "vision_feature_select_strategy": "default", "torch_dtype": "bfloat16",
                "text_config": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", **text, "max_position_embeddings": 32768,
                                "rope_theta": 1000000.0, "sliding_window": 32768, "use_sliding_window": False, "max_window_layers": 70,
                                "tie_word_embeddings": family.tied, "torch_dtype": "bfloat16"},
                "vision_config": vision, "tie_word_embeddings": family.tied}
    ids = {"image_token_id": tokens["<|image_pad|>"], "video_token_id": tokens["<|video_pad|>"],
           "vision_start_token_id": tokens["<|vision_start|>"], "vision_end_token_id": tokens["<|vision_end|>"]}
    if family.llm == "qwen2_5_vl":
        vision = {"depth": 2, "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "in_chans": 3,
                  "out_hidden_size": s.llm_hidden, "patch_size": 14, "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 56,
                  "fullatt_block_indexes": [1], "tokens_per_second": 2, "temporal_patch_size": 2, "model_type": "qwen2_5_vl"}
        half = d // 2
        return {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl", **text, **ids,
                "max_position_embeddings": 128000, "max_window_layers": 28, "rope_theta": 1000000.0, "sliding_window": 32768,
                "use_sliding_window": False, "rope_scaling": {"type": "mrope", "mrope_section": [half - 2 * (half * 3 // 8), half * 3 // 8, half * 3 // 8]},
                "tie_word_embeddings": family.tied, "torch_dtype": "bfloat16", "vision_config": vision}
    if family.llm in ("qwen3_5", "qwen3_5_moe"):
        return _qwen3_5_config(family, text, ids)
    vision = {"deepstack_visual_indexes": [0, 1], "depth": 3, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 32, "in_channels": 3,
              "initializer_range": 0.02, "intermediate_size": 64, "model_type": "qwen3_vl", "num_heads": 2, "num_position_embeddings": 16,
              "out_hidden_size": s.llm_hidden, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2}
    half = d // 2
    return {"architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl", **ids,
            "text_config": {**text, "model_type": "qwen3_vl_text", "attention_bias": False, "head_dim": d, "max_position_embeddings": 262144,
                            "rope_scaling": {"mrope_interleaved": True, "mrope_section": [half - 2 * (half * 5 // 16), half * 5 // 16, half * 5 // 16],
                                             "rope_type": "default"},
                            "rope_theta": 5000000, "dtype": "bfloat16"},
            "tie_word_embeddings": family.tied, "vision_config": vision}


# Qwen3.5's hybrid stack as released: three Gated DeltaNet (linear attention) layers, then one of gated full
# attention, with a quarter of each attention head rotated (M-RoPE's sections share that quarter's half).
QWEN3_5_LAYERS = ["linear_attention"] * 3 + ["full_attention"]
QWEN3_5_HEAD_DIM = 64


def _qwen3_5_config(family: Family, text: dict, ids: dict) -> dict:
    s = SIZES
    half = int(QWEN3_5_HEAD_DIM * 0.25) // 2  # released: 256 x 0.25 / 2 = 32 = 11 + 11 + 10
    text = {**text, "model_type": "qwen3_5_text", "attention_bias": False, "attn_output_gate": True, "head_dim": QWEN3_5_HEAD_DIM,
            "num_hidden_layers": len(QWEN3_5_LAYERS), "layer_types": QWEN3_5_LAYERS, "full_attention_interval": 4,
            "linear_conv_kernel_dim": 4, "linear_key_head_dim": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
            "linear_value_head_dim": 32, "mamba_ssm_dtype": "float32", "max_position_embeddings": 262144, "mtp_num_hidden_layers": 1,
            "mtp_use_dedicated_embeddings": False, "bos_token_id": ids["image_token_id"] - 12, "eos_token_id": ids["image_token_id"] - 12,
            "rope_parameters": {"mrope_interleaved": True, "mrope_section": [-(-half // 3), -(-half // 3), half - 2 * -(-half // 3)],
                                "rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25},
            "dtype": "bfloat16"}
    if family.llm == "qwen3_5_moe":  # every MLP a router over experts beside a shared expert, and no dense width
        del text["intermediate_size"]
        text |= {"model_type": "qwen3_5_moe_text", "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                 "shared_expert_intermediate_size": 64, "router_aux_loss_coef": 0.001, "output_router_logits": False}
    # Released with the vision tower's model_type its family's and an empty DeepStack list (transformers reads both).
    vision = {"deepstack_visual_indexes": [], "depth": 2, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 32, "in_channels": 3,
              "initializer_range": 0.02, "intermediate_size": 64, "model_type": family.llm, "num_heads": 2, "num_position_embeddings": 16,
              "out_hidden_size": s.llm_hidden, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2}
    architecture = "Qwen3_5MoeForConditionalGeneration" if family.llm == "qwen3_5_moe" else "Qwen3_5ForConditionalGeneration"
    return {"architectures": [architecture], "model_type": family.llm, **ids, "text_config": text,
            "tie_word_embeddings": family.tied, "transformers_version": "4.57.0.dev0", "vision_config": vision}


def _mtp_weights(config: dict, seed: int) -> dict[str, torch.Tensor]:
    """Qwen3.5's multi-token-prediction block as its safetensors hold it (`mtp.*`: one full-attention layer over the
    embedding and the last hidden state), which transformers' classes leave out on load."""
    text = config["text_config"]
    g = torch.Generator().manual_seed(seed + 3)
    normal = lambda *shape: torch.randn(*shape, generator=g) * 0.02  # noqa: E731
    h, d = text["hidden_size"], text["head_dim"]
    q, kv = text["num_attention_heads"] * d, text["num_key_value_heads"] * d
    mlp = lambda prefix, inter: {f"{prefix}gate_proj.weight": normal(inter, h), f"{prefix}up_proj.weight": normal(inter, h),  # noqa: E731
                                 f"{prefix}down_proj.weight": normal(h, inter)}
    if "num_experts" in text:
        experts = {"mlp.gate.weight": normal(text["num_experts"], h), "mlp.shared_expert_gate.weight": normal(1, h),
                   **mlp("mlp.shared_expert.", text["shared_expert_intermediate_size"])}
        for e in range(text["num_experts"]):
            experts |= mlp(f"mlp.experts.{e}.", text["moe_intermediate_size"])
    else:
        experts = mlp("mlp.", text["intermediate_size"])
    layer = {"self_attn.q_proj.weight": normal(2 * q, h), "self_attn.k_proj.weight": normal(kv, h), "self_attn.v_proj.weight": normal(kv, h),
             "self_attn.o_proj.weight": normal(h, q), "self_attn.q_norm.weight": normal(d), "self_attn.k_norm.weight": normal(d),
             **experts, "input_layernorm.weight": normal(h), "post_attention_layernorm.weight": normal(h)}
    return {"mtp.fc.weight": normal(h, 2 * h), "mtp.pre_fc_norm_embedding.weight": normal(h), "mtp.pre_fc_norm_hidden.weight": normal(h),
            "mtp.norm.weight": normal(h), **{f"mtp.layers.0.{name}": tensor for name, tensor in layer.items()}}


def _processor_config(family: Family) -> dict:
    s = SIZES
    if family.llm == "internvl":
        return {"crop_to_patches": False, "data_format": "channels_first", "do_convert_rgb": True, "do_normalize": True, "do_rescale": True,
                "do_resize": True, "image_mean": [0.485, 0.456, 0.406], "image_processor_type": "GotOcr2ImageProcessorFast",
                "image_std": [0.229, 0.224, 0.225], "max_patches": s.max_tiles, "min_patches": 1, "processor_class": "InternVLProcessor",
                "resample": 3, "rescale_factor": 1 / 255, "size": {"height": s.image_size, "width": s.image_size}}
    if family.llm == "qwen2_5_vl":  # 4 to 16 image tokens an image
        return {"min_pixels": 4 * 28 * 28, "max_pixels": 16 * 28 * 28, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
                "image_mean": QWEN_MEAN, "image_std": QWEN_STD, "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor"}
    return {"size": {"longest_edge": 16 * 32 * 32, "shortest_edge": 4 * 32 * 32}, "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "processor_class": "Qwen3VLProcessor",
            "image_processor_type": "Qwen2VLImageProcessorFast"}


def _write_native(family: Family, out_dir: Path, tokens: dict[str, int], seed: int) -> None:
    from transformers import CONFIG_MAPPING

    from mmjudge.judge.checkpoint import native_class

    raw = _native_config(family, tokens)
    _write_json(out_dir / "config.json", raw)
    config = CONFIG_MAPPING[raw["model_type"]].from_pretrained(out_dir)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = native_class(raw["model_type"])(config)
    _randomize(model, seed)
    model.generation_config.eos_token_id = [tokens["<|im_end|>"], tokens["<|endoftext|>"]] if family.llm != "internvl" else tokens["<|im_end|>"]
    model.generation_config.pad_token_id = tokens["<|endoftext|>"]
    model.save_pretrained(out_dir, safe_serialization=True)
    _write_json(out_dir / "config.json", raw)  # the released config, over transformers' own rendering of it
    if raw.get("text_config", {}).get("mtp_num_hidden_layers"):
        weights = load_file(out_dir / "model.safetensors")
        save_file(weights | _mtp_weights(raw, seed), out_dir / "model.safetensors", metadata={"format": "pt"})
    _write_json(out_dir / "preprocessor_config.json", _processor_config(family))
    if family.llm == "internvl":
        _write_json(out_dir / "processor_config.json", {"image_seq_length": SIZES.tokens_per_tile, "processor_class": "InternVLProcessor"})


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Every weight random (a fresh init leaves biases at 0 and norms at 1, which a wrong mapping would not disturb)."""
    g = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=g, dtype=torch.float32)
            norm = "norm" in name.rsplit(".", 2)[-2] if "." in name else False
            param.copy_(1 + 0.1 * noise if norm and name.endswith("weight") else 0.02 * noise)
