"""Each family's reward export read without mmjudge: its own tokenizer and chat template give mmjudge's prompt ids
(transformers' apply_chat_template, each image's tokens put where the template puts its image token), and its files
are what vLLM's pooling runner requires, on paper.

The template: InternVL's original layout has its template in Python, so its export writes one in Jinja; and
InternVL2-4B's reference tokenizer (transformers 4.37, not 'legacy') reads a lone word-start marker after BOS,
which transformers 5's does not: the template writes it (judge/detokenize.py). Before, the export had no chat
template, and with one rendered as mmjudge renders its text every prompt was one token shorter.

vLLM: not installed or run here (it needs a GPU build). What its pooling runner requires to load a checkpoint as a
one-label classifier (`--convert classify`, the default for an architecture named *ForSequenceClassification) is
held below as constants, read from vLLM 0.34.0's source (its PyPI wheel, vllm/_version.py commit g62d4bc3c7):

- vllm/config/model.py `_SUFFIX_TO_DEFAULTS`: "ForSequenceClassification" -> runner "pooling", convert "classify";
- vllm/model_executor/models/registry.py `_normalize_arch`: an architecture not in the registry has that suffix
  replaced by each default suffix in order (ForCausalLM, ForConditionalGeneration, ...), the first registered
  name is the model built; `as_seq_cls_model` (models/adapters.py) then wraps it;
- models/adapters.py `as_seq_cls_model`: the head is one linear layer `score` (ReplicatedLinear, no bias unless
  the checkpoint has `score.bias`) of hidden_size x num_labels, num_labels the top-level config's where it is not
  transformers' default 2 (`_resolve_num_labels`); a config with `method` or `classifier_from_token` is converted
  from the output layer instead; the pooler reads the LAST token (interfaces_base.py default_seq_pooling_type), a
  one-label classifier's activation is the sigmoid;
- each model's `hf_to_vllm_mapper.orig_to_new_prefix`: the weight-name prefixes it maps (the pooling loader
  also accepts names relative to the model: `_load_pooling_model_weights`);
- models/interns1.py: InternVLForConditionalGeneration is InternS1ForConditionalGeneration, whose processing is
  transformers' InternVLProcessor (GotOcr2ImageProcessor and the tokenizer's context_image_token, start_image_token
  and end_image_token), read from the checkpoint's processor files.
"""

import json

import pytest
from safetensors import safe_open

from mmjudge.infer.engine import prepare
from mmjudge.infer.options import ScoreOptions
from mmjudge.judge.data import Sample, Segment
from mmjudge.judge.formats import FORMATS
from mmjudge.judge.model import load_judge
from mmjudge.judge.prompts import build_prompt, load_rubrics
from mmjudge.judge.testing import write_dataset
from mmjudge.judge.testing.families import write_reward_checkpoint

pytestmark = pytest.mark.slow  # three exports written: about 10 s
FAMILIES = ("internvl2-4b", "qwen2.5-vl-3b", "qwen3-vl-4b", "qwen3.5-4b")
# Qwen3.5's template opens a thinking block unless told not to; a judge is prompted as its answers are rendered,
# after an empty one (judge/templates.py), which is what the template writes with enable_thinking=False.
TEMPLATE_FLAGS = {"qwen3.5-4b": {"enable_thinking": False}}

CLASSIFY_SUFFIX = "ForSequenceClassification"
BASE_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "ChatModel", "LMHeadModel")  # _SUFFIX_TO_DEFAULTS' generate ones, in order
REGISTERED = {  # the registry's entries for these families' names (model module, class)
    "Qwen2_5_VLForConditionalGeneration": ("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"),
    "Qwen3VLForConditionalGeneration": ("qwen3_vl", "Qwen3VLForConditionalGeneration"),
    "InternVLForConditionalGeneration": ("interns1", "InternS1ForConditionalGeneration"),
}
WEIGHT_PREFIXES = {  # hf_to_vllm_mapper.orig_to_new_prefix of each class, and the head
    "Qwen2_5_VLForConditionalGeneration": ("model.language_model.", "model.visual.", "lm_head.", "model."),
    "Qwen3VLForConditionalGeneration": ("model.visual.", "lm_head.", "model.language_model."),
    "InternVLForConditionalGeneration": ("lm_head.", "model.language_model.", "model.vision_tower.", "model.multi_modal_projector."),
}
HEAD = {"score.weight"}  # as_seq_cls_model's `score`; `score.bias` optional
ONLINE_CONVERSION = ("method", "classifier_from_token")  # config keys that make vLLM build the head from lm_head instead
DEFAULT_NUM_LABELS = 2  # transformers' PreTrainedConfig().num_labels, which _resolve_num_labels looks past
INTERNVL_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")  # InternVLProcessor.from_pretrained's
INTERNVL_TOKENIZER_TOKENS = ("context_image_token", "start_image_token", "end_image_token")


def vllm_model(architecture: str) -> str | None:
    """The registered architecture vLLM builds for `architecture` under --convert classify (_normalize_arch)."""
    if architecture in REGISTERED or not architecture.endswith(CLASSIFY_SUFFIX):
        return architecture if architecture in REGISTERED else None
    return next((base for suffix in BASE_SUFFIXES if (base := architecture.removesuffix(CLASSIFY_SUFFIX) + suffix) in REGISTERED), None)


def pooling_problems(path) -> list[str]:
    """What in a reward export vLLM's pooling runner, as its source reads, would not load as a one-label classifier."""
    config = json.loads((path / "config.json").read_text())
    problems = []
    architecture = (config.get("architectures") or [None])[0]
    if (built := vllm_model(architecture or "")) is None:
        return [f"architecture {architecture}: no registered model"]
    with safe_open(path / "model.safetensors", "pt") as weights:
        names = {name: weights.get_slice(name).get_shape() for name in weights.keys()}
    stray = sorted(n for n in names if n not in HEAD | {"score.bias"} and not n.startswith(WEIGHT_PREFIXES[built]))
    if stray:
        problems.append(f"weights {stray[:3]} under no prefix {built} maps")
    labels = len(config.get("id2label") or {}) or DEFAULT_NUM_LABELS  # transformers' num_labels, as vLLM reads it
    hidden = (config.get("text_config") or config)["hidden_size"]
    if names.get("score.weight") != [labels, hidden]:
        problems.append(f"head: score.weight {names.get('score.weight')}, {sorted(n for n in names if n.startswith('score.'))}; "
                        f"vLLM builds one linear layer [{labels}, {hidden}]")
    problems += [f"config {key}: vLLM would build the head from lm_head" for key in ONLINE_CONVERSION if key in config]
    if built == "InternVLForConditionalGeneration":
        tokenizer = json.loads((path / "tokenizer_config.json").read_text())
        problems += [f"no {name}: InternVLProcessor reads it" for name in INTERNVL_PROCESSOR_FILES if not (path / name).is_file()]
        problems += [f"tokenizer has no {name}" for name in INTERNVL_TOKENIZER_TOKENS if name not in (tokenizer.get("extra_special_tokens") or {})]
    return problems


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("exports")
    return {family: write_reward_checkpoint(root / family, family=family) for family in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_an_exports_own_chat_template_gives_mmjudges_prompt_ids(exports, family, tmp_path):
    from transformers import AutoTokenizer

    data = write_dataset(tmp_path / "data", 2, seed=0).parent
    image = sorted((data / "images").iterdir())[0]
    judge, rubrics = load_judge(exports[family]), load_rubrics(FORMATS["pairs"].default_rubrics)
    tokenizer = AutoTokenizer.from_pretrained(exports[family])  # transformers' own, from the export's files
    start, context, end = judge.settings.images.image_tokens
    for question in ([Segment(text="What is it?")], [Segment(text="What is it?"), Segment(image=str(image))]):
        sample = Sample(id="SA_1", question=question, answer=[Segment(text="A boat.")])
        ids = prepare(judge, [(0, sample)], rubrics, data, ScoreOptions())[0].input_ids.tolist()
        prompt = build_prompt(sample, rubrics["SA"], judge.settings.template, judge.settings.system_message, data, judge.settings.images)
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt.chat_content()}], add_generation_prompt=True, tokenize=False,
                                             **TEMPLATE_FLAGS.get(family, {}))
        # each image's tokens where the template put its image token, as the family's processor writes them: InternVL's
        # template writes the context token alone, and its processor the start and end tokens around the tiles' tokens
        wraps, pieces = start not in text, text.split(context)
        assert len(pieces) == len(prompt.images) + 1
        text = pieces[0] + "".join((start + context * p.tokens + end if wraps else context * p.tokens) + piece for p, piece in zip(prompt.images, pieces[1:]))
        assert tokenizer(text, add_special_tokens=False).input_ids == ids


@pytest.mark.parametrize("family, built", [("qwen2.5-vl-3b", "Qwen2_5_VLForConditionalGeneration"), ("qwen3-vl-4b", "Qwen3VLForConditionalGeneration")])
def test_a_qwen_reward_export_is_what_vllms_pooling_runner_loads(exports, family, built):
    config = json.loads((exports[family] / "config.json").read_text())
    assert vllm_model(config["architectures"][0]) == built
    assert pooling_problems(exports[family]) == []


def test_the_internvl_reward_export_lacks_only_the_processor_vllm_reads_internvl_images_with(exports):
    """vLLM maps the name to its InternVL model, weights and head fit; what is missing is transformers' processor for
    InternVL's native layout, which an export of InternVL's original layout does not write: tiles as InternVL's
    code makes them are not what that processor makes (docs/reward-models.md)."""
    assert vllm_model("InternVLForSequenceClassification") == "InternVLForConditionalGeneration"
    assert pooling_problems(exports["internvl2-4b"]) == [*(f"no {name}: InternVLProcessor reads it" for name in INTERNVL_PROCESSOR_FILES),
                                                         *(f"tokenizer has no {name}" for name in INTERNVL_TOKENIZER_TOKENS)]


def test_the_check_finds_what_vllm_would_refuse(exports, tmp_path):
    """An MLP head (score.0.*, score.2.weight: not one linear layer), an unknown name, a weight outside the
    prefixes, and a head read from lm_head are each found."""
    import shutil

    from safetensors.torch import load_file, save_file

    broken = shutil.copytree(exports["qwen2.5-vl-3b"], tmp_path / "broken")
    weights = load_file(broken / "model.safetensors")
    head = weights.pop("score.weight")
    save_file({**weights, "score.0.weight": head.clone(), "score.2.weight": head[:, :1].T.contiguous(), "stray.weight": head.clone()}, broken / "model.safetensors")
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "method": "from_2_way_softmax"}))
    problems = pooling_problems(broken)
    assert any("stray.weight" in p for p in problems) and any(p.startswith("head: score.weight None") for p in problems)
    assert any(p.startswith("config method") for p in problems)
    (broken / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen2_5_VLForTokenClassification"]}))
    assert pooling_problems(broken) == ["architecture Qwen2_5_VLForTokenClassification: no registered model"]
