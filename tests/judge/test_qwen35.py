"""Qwen3.5 as a backbone (a hybrid: Gated DeltaNet layers, with a recurrent state, between gated full-attention
layers), against transformers' own: its tiny checkpoint in the released layout, the prompts its official
processor and chat template make, and the logits of transformers' own forward. The engine's side (judge-score,
judge-serve) is the decoder's and is tested with it; here, the model as training runs it."""

import json
import shutil

import pytest
import torch
from PIL import Image

from mmjudge.configs import CONFIG_DIR
from mmjudge.infer.engine import prepare
from mmjudge.infer.options import ScoreOptions
from mmjudge.judge.data import load_samples
from mmjudge.judge.model import load_judge
from mmjudge.judge.prompts import build_prompt, load_rubrics
from mmjudge.judge.testing import write_dataset
from mmjudge.judge.testing.families import write_family_checkpoint
from mmjudge.train.data import IGNORE_INDEX, Collator
from tests.judge.test_backbones import ImagesAndText, _images


@pytest.fixture(scope="module", params=["qwen3.5-9b", pytest.param("qwen3.5-35b-a3b", marks=pytest.mark.slow)])
def qwen35(request, tmp_path_factory):
    """Qwen3.5 dense, and its mixture of experts (the same adapter: routed experts stored one by one, a shared one)."""
    path = write_family_checkpoint(request.param, tmp_path_factory.mktemp("qwen35") / "judge")
    return path, load_judge(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """8 synthetic samples (0-4 images each), and 8 more, each with one image of the edge set (every mode, sizes
    around the tiny processor's least and most pixels) in its answer."""
    root = tmp_path_factory.mktemp("qwen35-data")
    records = json.loads(write_dataset(root, 8, seed=5).read_text())
    for k, image in enumerate(_images(root / "images", 8, seed=6)):
        records.append({**records[0], "id": f"SA_edge_{k}", "answer": [{"text": "It shows this."}, {"image": f"images/{image.name}"}]})
    (root / "data.json").write_text(json.dumps(records))
    return root


def official_inputs(processor, prompt, images):
    """What Qwen3.5's official processor makes of the same user turn: its chat template with thinking off, which
    is how the template renders a turn before an answer (judge/templates.py), and its image processor."""
    pieces = prompt.query.split("<image>")
    content = [item for k, piece in enumerate(pieces)
               for item in [{"type": "text", "text": piece}] * bool(piece) + [{"type": "image"}] * (k < len(pieces) - 1)]
    text = processor.apply_chat_template([{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True,
                                         enable_thinking=False)
    return processor(text=[text], images=[Image.open(image.path) for image in images] or None, return_tensors="pt")


@pytest.mark.slow
def test_prompts_and_logits_are_transformers_own_on_samples_and_edge_images(qwen35, data):
    """16 samples (the mixture of experts: the 8 with edge images): mmjudge's prompt ids and pixels are the official
    processor's, and the model as training runs it (the Collator's right-padded batch, each row's 3-D positions by
    the backbone's rule) gives the logits of transformers' own forward on the processor's inputs, one sample at a
    time, within 1e-5 in fp32."""
    from transformers import AutoModelForImageTextToText

    path, judge = qwen35
    samples, rubrics = load_samples(data / "data.json", data), load_rubrics([CONFIG_DIR / "rubrics" / "tiny"])
    items = prepare(judge, list(enumerate(samples)), rubrics, data, ScoreOptions(max_tiles=2))
    assert len(items) == 16 and sum(bool(item.images) for item in items) >= 14
    if judge.model.config.model_type == "qwen3_5_moe":  # the dense family's in all but its MLPs: the 8 edge images suffice (time)
        items, samples = items[8:], samples[8:]
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    processor = ImagesAndText(path, model.config.model_type)
    rows, references = [], []
    for item, sample in zip(items, samples):
        prompt = build_prompt(sample, rubrics[sample.category], judge.settings.template, None, data, judge.settings.images.with_max_tiles(2))
        inputs = official_inputs(processor, prompt, item.images)
        ids = item.input_ids.tolist()
        assert inputs["input_ids"][0].tolist() == ids, sample.id
        rows.append({"input_ids": ids, "labels": [IGNORE_INDEX] * len(ids), "image_paths": [str(image.path) for image in item.images],
                     "image_settings": [json.dumps(image.processing.stored()) for image in item.images]})
        with torch.no_grad():
            references.append(model(**inputs).logits[0])
    batch = Collator(judge.pad_id, judge.backbone, judge.settings.images)(rows)
    with torch.no_grad():
        logits = judge.model(**{name: value for name, value in batch.items() if name != "labels"}).logits
    for row, reference in enumerate(references):
        torch.testing.assert_close(logits[row, : len(reference)], reference, rtol=0, atol=1e-5)


def test_its_tokenizer_is_the_one_transformers_loads_for_it(qwen35):
    """Qwen3.5's tokenizer_config.json names Qwen2Tokenizer, whose split rule keeps combining marks out of words;
    transformers' AutoTokenizer takes Qwen3_5Tokenizer for the family, and so does the judge."""
    from transformers import AutoTokenizer

    path, judge = qwen35
    assert json.loads((path / "tokenizer_config.json").read_text())["tokenizer_class"] == "Qwen2Tokenizer"
    official = AutoTokenizer.from_pretrained(path)
    assert type(judge.tokenizer) is type(official) and type(official).__name__ == "Qwen3_5Tokenizer"
    assert str(judge.tokenizer.backend_tokenizer.pre_tokenizer) == str(official.backend_tokenizer.pre_tokenizer)


def test_its_template_opens_the_answer_as_it_renders_one(qwen35):
    """Qwen3.5's generation prompt opens a thinking block ("<think>\\n"); the answers it renders come after an empty
    one. The judge is prompted as an answer is rendered (as enable_thinking=False prompts), so that a trained
    answer follows its prompt as the template renders the pair."""
    _, judge = qwen35
    template = judge.settings.template
    assert template.assistant_role == "<|im_start|>assistant\n<think>\n\n</think>\n\n" and template.default_system_message is None
    messages = [{"role": "user", "content": "Rate it."}]
    answered = judge.tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": "Score: 4"}], tokenize=False)
    assert answered == template.render("Rate it.") + template.target("Score: 4")
    assert template.render("Rate it.") == judge.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                                              enable_thinking=False)


def test_its_multi_token_prediction_weights_are_in_the_files_and_left_out_of_the_model(qwen35, tmp_path):
    """The released safetensors hold the MTP block (`mtp.*`), which transformers' classes leave out on load: the size
    check counts the model's weights only, and a weight the model lacks elsewhere is still refused."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from mmjudge.judge.checkpoint import CheckpointError

    path, judge = qwen35
    with safe_open(path / "model.safetensors", "pt") as f:
        assert any(key.startswith("mtp.") for key in f.keys())
    assert not any(name.startswith("mtp") for name, _ in judge.model.named_parameters())
    broken = shutil.copytree(path, tmp_path / "broken")
    weights = load_file(broken / "model.safetensors")
    save_file(weights | {"model.extra.weight": torch.zeros(4)}, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="the weight files hold"):
        load_judge(broken)


def test_a_trimming_templates_query_loses_only_the_whitespace_at_its_two_ends():
    """As Jinja's `trim` strips a message's text: across parts, the image tokens (control parts) kept whole."""
    from mmjudge.judge.templates import trimmed

    parts = [(" \n", False), ("  Look:\n", False), ("<|image_pad|>", True), ("\n so.  ", False), ("\n", False)]
    assert trimmed(parts) == [("Look:\n", False), ("<|image_pad|>", True), ("\n so.", False)]
    assert "".join(p for p, _ in trimmed(parts)) == "".join(p for p, _ in parts).strip()
    assert trimmed([(" \n ", False)]) == [] and trimmed([("a", False)]) == [("a", False)]
