"""Structured outputs in the decoder (infer/grammar.py, infer/decoding.py) on the tiny judge: every row's
text follows its own grammar, chosen or drawn after its mask, and a constrained answer is the same alone
and batched beside unconstrained and other constrained rows."""

import json
import re

import pytest
import torch

from mmjudge.infer import grammar
from mmjudge.infer.sampler import Sampling
from mmjudge.infer.scheduler import Request
from mmjudge.infer.engine import judge_vocabulary
from tests.infer.test_decoding import answers, chat_decoder, chat_ids, judge, prompts  # noqa: F401 - fixtures


@pytest.fixture(scope="module")
def vocabulary(judge):  # noqa: F811
    return judge_vocabulary(judge)


VERDICT = {"type": "object", "properties": {"better": {"enum": ["A", "B", "tie"]}, "score": {"type": "integer", "minimum": 0, "maximum": 6},
                                            "sure": {"type": "boolean"}},
           "required": ["better", "score", "sure"], "additionalProperties": False}


def text(judge, completion):  # noqa: F811
    return judge.decode([t for t in completion.tokens if t != judge.tokenizer.convert_tokens_to_ids("<|end|>")])


def test_the_mask_of_a_row_allows_exactly_its_bits():
    masks = torch.tensor([[0b1011, 0], [-1, -1]], dtype=torch.int32)
    allowed = grammar.allowed_tokens(masks, 40)
    assert allowed.shape == (2, 40)
    assert allowed[0].nonzero().flatten().tolist() == [0, 1, 3] and bool(allowed[1].all())
    assert grammar.allowed_tokens(torch.tensor([[-(1 << 31)]], dtype=torch.int32), 32)[0].nonzero().flatten().tolist() == [31]  # the sign bit


def test_invalid_grammars_are_refused_with_the_reason(vocabulary):
    for build, why in [(lambda: grammar.json_schema(vocabulary, {"type": "nope"}), "nope"), (lambda: grammar.regex(vocabulary, "(a"), "regex"),
                       (lambda: grammar.grammar(vocabulary, "start: ??"), "Expected")]:
        with pytest.raises(grammar.GrammarError, match=why):
            build()
    assert grammar.json_schema(vocabulary, VERDICT) is grammar.json_schema(vocabulary, json.loads(json.dumps(VERDICT)))  # compiled once


def test_each_row_follows_its_own_grammar_and_the_same_rows_write_the_same_alone_and_batched(judge, prompts, vocabulary):  # noqa: F811
    """Greedy and seeded sampled rows under a JSON schema, a regex, a choice and none, in one batch and each alone."""
    kinds = {
        "schema": grammar.json_schema(vocabulary, VERDICT),
        "regex": grammar.regex(vocabulary, r"(Score|Rating): [0-6]\.?"),
        "choice": grammar.choice(vocabulary, ["yes", "no", "cannot tell"]),
        "object": grammar.json_object(vocabulary),
    }
    specs = [(kind, sampling) for kind in [*kinds, None] for sampling in (Sampling(), Sampling(temperature=1.0, seed=7))]
    requests = lambda: [Request(k, prompts[k % len(prompts)], max_new_tokens=160, sampling=sampling, grammar=kinds.get(kind))  # noqa: E731
                        for k, (kind, sampling) in enumerate(specs)]
    batched = answers(chat_decoder(judge), requests())
    alone = {key: c for r in requests() for key, c in answers(chat_decoder(judge), [r]).items()}
    assert {key: c.tokens for key, c in batched.items()} == {key: c.tokens for key, c in alone.items()}
    for k, (kind, sampling) in enumerate(specs):
        completion, written = batched[k, 0], text(judge, batched[k, 0])
        if kind is None:
            continue
        if kind == "object" and completion.finish_reason == "length":  # a key of its own making runs on: the random judge's strings never end
            assert written.startswith('{"'), written
            continue
        assert completion.finish_reason == "stop", (kind, written)  # the grammar reached its end, and only the stop token was left
        if kind == "schema":
            verdict = json.loads(written)
            assert set(verdict) == {"better", "score", "sure"} and verdict["better"] in ("A", "B", "tie") and 0 <= verdict["score"] <= 6
        elif kind == "regex":
            assert re.fullmatch(r"(Score|Rating): [0-6]\.?", written), written
        elif kind == "choice":
            assert written in ("yes", "no", "cannot tell")
        else:
            assert isinstance(json.loads(written), dict)
    unconstrained = [text(judge, batched[k, 0]) for k, (kind, _) in enumerate(specs) if kind is None]
    assert not any(w in ("yes", "no", "cannot tell") for w in unconstrained)  # the random judge left alone writes gibberish


def test_a_constrained_row_writes_the_likeliest_allowed_token_and_logprobs_stay_the_models(judge, prompts, vocabulary):  # noqa: F811
    free = answers(chat_decoder(judge), [Request(0, prompts[0], max_new_tokens=1)], top_logprobs=5)[0, 0]
    options = ["yes", "no"]
    constrained = answers(chat_decoder(judge), [Request(0, prompts[0], max_new_tokens=1, grammar=grammar.choice(vocabulary, options))],
                          top_logprobs=5)[0, 0]
    first = {judge.tokenizer("x" + o, add_special_tokens=False).input_ids[-1] for o in options} | {
        t for o in options for t in judge.tokenizer(o, add_special_tokens=False).input_ids if judge.tokenizer.convert_ids_to_tokens(t) != "▁"}
    assert constrained.tokens[0] != free.tokens[0] and free.tokens[0] not in first
    # the log-probabilities shown are the model's own (vLLM's raw_logprobs): the unconstrained top is still listed
    assert free.tokens[0] in constrained.top_ids[0].tolist()
    assert constrained.top_logprobs[0, 0] < free.top_logprobs[0, 0]


# -- judge-score --structured ----------------------------------------------------------------------------

from hypothesis import given, settings, strategies as st  # noqa: E402

from mmjudge.infer.cli import main as score_main  # noqa: E402
from mmjudge.judge.parsing import ScoreScale, parse_judgement  # noqa: E402
from mmjudge.judge.prompts import load_rubrics  # noqa: E402

LABELS = {"text_quality": "Text quality", "image_quality": "Image quality", "text_image_coherence": "Text-image coherence",
          "style_consistency": "Stylistic consistency"}  # MMIE's, configs/rubrics/sa.yaml
FREE = st.lists(st.sampled_from([*"ab #:\n9", "Score", "### Scor", "Text quality: 9\n", "\n### Score", "core\n"]), max_size=12).map("".join)


@pytest.fixture(scope="module")
def score_grammar(vocabulary):
    return grammar.score_lines(vocabulary, tuple(LABELS.values()), tuple(str(level) for level in ScoreScale().levels))


def walk(judge, matcher, text: str) -> int:  # noqa: F811
    """How many of the text's tokens the grammar takes in turn."""
    for taken, token in enumerate(judge.tokenizer(text, add_special_tokens=False).input_ids):
        if not matcher._matcher.try_consume_tokens([token]):
            return taken
    return len(judge.tokenizer(text, add_special_tokens=False).input_ids)


@settings(max_examples=60, deadline=None)
@given(free=FREE, levels=st.lists(st.integers(0, 6), min_size=5, max_size=5), wrong=st.integers(7, 99))
def test_every_answer_the_score_grammar_lets_end_parses_to_its_own_scores_on_the_scale(judge, score_grammar, free, levels, wrong):  # noqa: F811
    """An answer ends only once its criterion lines and score are written, each on the scale; free text
    holding '### Score' is refused, so the first heading the parser finds is the constrained one."""
    tail = "".join(f"{label}: {level}\n" for label, level in zip(LABELS.values(), levels)) + f"### Score\n{levels[-1]}"
    text = f"{free}\n{tail}"
    tokens = judge.tokenizer(text, add_special_tokens=False).input_ids
    matcher = score_grammar.matcher()
    taken = walk(judge, matcher, text)
    if "### Score" in free:
        assert taken < len(tokens)
        return
    assert taken == len(tokens), text
    masks = grammar.token_masks([matcher], judge.model.config.text_config.vocab_size)
    allowed = grammar.allowed_tokens(masks, judge.model.config.text_config.vocab_size)[0].nonzero().flatten().tolist()
    assert allowed == [judge.tokenizer.convert_tokens_to_ids("<|end|>")]  # nothing after the score but the end
    judgement = parse_judgement(text, LABELS, ScoreScale())
    assert judgement.error is None and judgement.score == levels[-1]
    assert list(judgement.criteria.values()) == levels[:4]
    # a score off the scale, in a criterion line or the score line, is never taken
    for off in (tail.replace(f"Text quality: {levels[0]}", f"Text quality: {wrong}"), tail[: -len(str(levels[-1]))] + str(wrong)):
        assert walk(judge, score_grammar.matcher(), f"{free}\n{off}") < len(judge.tokenizer(f"{free}\n{off}", add_special_tokens=False).input_ids)


def test_structured_runs_say_so_in_the_summary_resume_apart_and_constrain_every_request(judge, tmp_path, capsys, monkeypatch):  # noqa: F811
    from mmjudge.infer import engine
    from mmjudge.judge.testing import write_dataset, write_original_checkpoint

    data = write_dataset(tmp_path / "data", 3, seed=0).parent
    checkpoint = write_original_checkpoint(tmp_path / "ckpt", seed=0)
    sent = []
    generate = engine.Decoder.generate
    monkeypatch.setattr(engine.Decoder, "generate", lambda self, requests, *a, **k: sent.extend(requests) or generate(self, requests, *a, **k))
    args = ["--model_path", str(checkpoint), "--input_dir", str(data), "--input_file", "data.json", "--output_dir", str(tmp_path / "out"),
            "--max_new_tokens", "4", "--max_tiles", "2"]
    assert score_main(args) == 0
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["structured"] is False and all(r.grammar is None for r in sent)
    sent.clear()
    capsys.readouterr()
    assert score_main([*args, "--structured"]) == 2  # the journal of the unconstrained run is not resumed as its results
    assert "was written by a run with other settings" in capsys.readouterr().err
    assert score_main([*args, "--structured", "--no_resume"]) == 0
    out, err = capsys.readouterr()
    assert "resuming" not in err and "Structured: each answer held to its rubric's layout and scale by a grammar (--structured)" in out
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["structured"] is True
    assert len(sent) == 3 and all(r.grammar is not None for r in sent)
    expected = {f"one line per criterion ({', '.join(rubric.criteria.values())}) and a score line, each scored 0 | 1 | 2 | 3 | 4 | 5 | 6"
                for rubric in load_rubrics().values()}
    assert {r.grammar.description for r in sent} <= expected


@pytest.mark.parametrize("flags, message", [(["--mode", "logits"], "structured constrains what the judge writes, and --mode logits writes nothing"),
                                            (["--backend", "openai", "--base_url", "http://127.0.0.1:9/v1"], "--structured constrains this machine's decoder")])
def test_structured_where_it_cannot_work_is_refused_before_anything_loads(tmp_path, capsys, flags, message):
    from mmjudge.judge.testing import write_dataset

    data = write_dataset(tmp_path / "data", 1, seed=0).parent
    assert score_main(["--model_path", str(tmp_path / "nowhere"), "--input_dir", str(data), "--input_file", "data.json", "--structured",
                       "--output_dir", str(tmp_path / "out"), *flags]) == 2
    assert message in capsys.readouterr().err


def test_structured_scores_samples_under_a_rubric_set_that_holds_a_pairwise_rubric(judge, tmp_path, capsys):  # noqa: F811
    """`--rubric tiny` brings the pairwise rubric beside the samples' rubrics: it is no matter until a pair
    comes, and a pair judged by it is refused before anything loads."""
    from mmjudge.judge.testing import write_dataset, write_original_checkpoint, write_pairs

    data = write_dataset(tmp_path / "data", 2, seed=0).parent
    checkpoint = write_original_checkpoint(tmp_path / "ckpt", seed=0)
    common = ["--rubric", "tiny", "--max_tiles", "1", "--max_new_tokens", "4", "--structured"]
    assert score_main(["--model_path", str(checkpoint), "--input_dir", str(data), "--input_file", "data.json",
                       "--output_dir", str(tmp_path / "out"), *common]) == 0
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["structured"] is True
    pairs = write_pairs(tmp_path / "pairs", 2, seed=0)
    capsys.readouterr()
    assert score_main(["--model_path", str(tmp_path / "nowhere"), "--input_dir", str(pairs.parent), "--input_file", pairs.name,
                       "--output_dir", str(tmp_path / "out2"), *common]) == 2
    err = capsys.readouterr().err
    assert "leave --structured out for pairs judged by a pairwise rubric" in err and "nowhere" not in err


def test_the_engine_refuses_a_pair_under_a_pairwise_rubric_when_structured(judge, tmp_path):  # noqa: F811
    from mmjudge.configs import CONFIG_DIR
    from mmjudge.infer.engine import Scorer, prepare
    from mmjudge.infer.options import ScoreOptions
    from mmjudge.judge.data import UsageError
    from mmjudge.judge.formats import FORMATS
    from mmjudge.judge.testing import write_pairs

    rubrics = load_rubrics([CONFIG_DIR / "rubrics" / "tiny"])
    options = ScoreOptions(structured=True, max_tiles=1, max_new_tokens=4)
    scorer = Scorer(judge, rubrics, options, "cpu")
    assert "general" not in scorer.grammars and scorer.grammars  # the samples' rubrics have their layouts
    pairs = write_pairs(tmp_path / "pairs", 1, seed=0)
    bench = FORMATS["pairs"].read(pairs, pairs.parent, rubrics)
    items = prepare(judge, list(enumerate(bench.samples)), rubrics, pairs.parent, options)
    with pytest.raises(UsageError, match="leave --structured out for pairs"):
        next(scorer.run(items))


def test_a_grammar_no_text_satisfies_is_refused_when_compiled(vocabulary):
    """Issue 45, item 5: a `$ref` cycle or an empty character class compiled, and the answer was the stop token
    alone: empty content with finish_reason "stop", as if the judge had answered."""
    for build in (lambda: grammar.json_schema(vocabulary, {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}),
                  lambda: grammar.regex(vocabulary, r"[^\s\S]"), lambda: grammar.regex(vocabulary, r"Score: [^\x00-\x{10FFFF}]"),
                  lambda: grammar.grammar(vocabulary, "start: a\na: a")):
        with pytest.raises(grammar.GrammarError, match="no text satisfies it"):
            build()
    assert grammar.regex(vocabulary, r"Score: [0-6]").description == "a regular expression"


def test_a_grammar_that_takes_too_long_to_compile_is_refused_and_no_one_waits_for_it():
    """Issue 45, item 5: a grammar whose compile never ends here (it waits for an event) is refused at the time
    limit; its thread is a daemon, so a server stopping does not wait for it either."""
    import threading

    release = threading.Event()
    threads = []

    def build():
        threads.append(threading.current_thread())
        release.wait()
        raise AssertionError("never reached before the limit")

    with pytest.raises(grammar.GrammarError, match=r"takes more than 0.01 s to compile, this server's limit \(--max_grammar_seconds\)"):
        grammar.within(0.01, build)
    assert threads[0].daemon and threads[0].is_alive()
    release.set()
    threads[0].join()  # its compile slot is free again before the next test (grammar.COMPILING)
    assert grammar.within(60, lambda: "compiled") == "compiled"


def test_abandoned_compiles_hold_their_slots_so_a_flood_of_slow_grammars_runs_at_most_two_threads():
    """Issue 45: a compile refused at the time limit went on in its thread, and every new slow grammar
    started another (a flood of them took every core). Abandoned ones keep their slot until they end."""
    import threading

    release, threads = threading.Event(), []

    def slow():
        threads.append(threading.current_thread())
        release.wait()

    try:
        for _ in range(grammar.COMPILING):
            with pytest.raises(grammar.GrammarError, match="takes more than"):
                grammar.within(0.01, slow)
        with pytest.raises(grammar.GrammarBusy, match=r"2 other grammars were still compiling after 0.05 s"):
            grammar.within(0.05, slow)
        assert len(threads) == grammar.COMPILING  # the refused request started none
    finally:
        release.set()
        for thread in threads:
            thread.join()
    assert grammar.within(60, lambda: "compiled") == "compiled"
