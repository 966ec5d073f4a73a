"""OpenING / Interleaved Arena (github LanceZPF/OpenING): pairs of interleaved answers by generative models,
judged against people with ties.

Reads a battle file as the repository keeps it in Interleaved_Arena/: a list of `{data_id, model_A: {id, name},
model_B: {id, name}, winner?}` (data_instance_modelAB.json has no winner; judge_modelAB_results.json holds
people's, one of A, B, Tie(A), Tie(B)). Each model's answer is `<name>_output/<data_id>.json` beside the file,
`{conversations: [{input: [{text, image}]}, {output: [{text, image}]}], meta_task_name, ...}`, as
IntJudge_judge_AB.py reads it. The question is model A's input, its images relative to --input_dir (the
OpenING-benchmark folder); an answer's images are in its model's folder, and one that is missing is left
out, as IntJudge leaves it out. Texts are read as IntJudge reads them: stripped, without the `<image>`
placeholder, and, in the question, without the `<BEGIN>` marker. The pair's id is
`<data_id>_<name A>_<name B>`, the key calculate_agreement.py matches battles by; its group, the task's
meta_task_name; people's Tie(A) and Tie(B) are ties.

Writes the results file IntJudge writes and calculate_agreement.py reads, `opening_judge_results.json`: the
battles judged, each with the judge's winner as IntJudge names it (its verdict in the battle's own order,
this toolkit's forward order). Where the input holds people's winners, `opening_agreement.json` holds
calculate_agreement.py's figures by its rules: agreement with people with ties forced into A or B (Tie(A)
is A, Tie(B) is B, a plain tie is A), with ties as a verdict of their own, and without the battles either
side calls a tie; each also for battles with and without a model of the unseen set and their harmonic mean.
And the judge's win rates of the models, calculate_model_winrate.py's four tie rules: ties forced into A or
B, ties left out, a tie worth 0, a tie worth 0.5, in `opening_winrates.json` and in its CSV files (one row
per model, its win rate against each other model), named as it names them.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, field_validator

from mmjudge.judge.data import (InputError, JudgeText, Pair, PairResult, Problem, Segment, missing_file, parse_records, read_json, read_records,
                                resolve_image, validation_problems, write_json_atomically, write_text_atomically)
from mmjudge.judge.formats.base import (BenchmarkInput, Format, Preference, PreferenceFile, first_record, judgements, pair_input, preferences_of,
                                        spreadsheet_cell)

if TYPE_CHECKING:
    from mmjudge.judge.prompts import Rubric

CATEGORY = "opening"
RESULTS, AGREEMENT, WINRATES = "opening_judge_results.json", "opening_agreement.json", "opening_winrates.json"
# calculate_agreement.py's unseen models, as it spells them (its 'GPT-4+DALL-E3' names no model of the battles)
UNSEEN_MODELS = ("anole", "GPT-4+DALL-E3", "SEED-LLaMA", "NExT-GPT")
# calculate_model_winrate.py's CSV file of each tie rule
WINRATE_CSVS = {"force_divide": "model_win_rates.csv", "without_tie": "model_win_rates_notie.csv",
                "tie_zero": "model_win_rates_withtie0.csv", "tie_half": "model_win_rates_withtie05.csv"}


class Model(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str | int
    name: str

    @field_validator("name")
    @classmethod
    def _a_folder_s_name(cls, name: str) -> str:
        # A model's answers are <name>_output/ beside the battle file: a name with a path in it reads answers elsewhere.
        return file_name_part(name, "model name")


def file_name_part(value: str, what: str) -> str:
    """A name that goes into the path of an answer file (<name>_output/<data_id>.json): no path in it."""
    if any(c in value for c in "/\\\0") or not value.strip():
        raise ValueError(f"{value!r} is no {what}: it names an answer file, <name>_output/<data_id>.json beside the battle file, "
                         "so it holds no '/', '\\' or NUL")
    return value


class Battle(BaseModel):
    model_config = ConfigDict(extra="allow", protected_namespaces=())  # model_A, model_B: OpenING's fields
    data_id: str | int
    model_A: Model
    model_B: Model
    winner: str | None = None

    @field_validator("data_id")
    @classmethod
    def _a_file_s_name(cls, data_id: str | int) -> str | int:
        return file_name_part(data_id, "data_id") if isinstance(data_id, str) else data_id

    @field_validator("winner")
    @classmethod
    def _a_winner(cls, winner: str | None) -> str | None:
        # OpenING's files hold A, B, Tie(A), Tie(B); IntJudge writes a tie as its judge's first five characters and
        # ")" ("tie ()"). Anything else ("X", "B ") was read as no preference, silently.
        if winner is None or winner in ("A", "B") or winner[:3].lower() == "tie":
            return winner
        raise ValueError(f"{winner!r} is no winner of OpenING's: A, B, or a tie (Tie(A), Tie(B), Tie)")


class Step(BaseModel):
    model_config = ConfigDict(extra="allow")
    text: JudgeText | None = None
    image: str | None = None


class Output(BaseModel):
    model_config = ConfigDict(extra="allow")
    conversations: list[dict]
    meta_task_name: str | None = None

    def steps(self, key: str, turn: int) -> list[Step]:
        steps = self.conversations[turn].get(key, [])
        if not isinstance(steps, list):
            raise ValueError(f"conversations[{turn}].{key} must be a list of steps, got {type(steps).__name__}")
        return [Step.model_validate(step) for step in steps]


def looks_like(content: object) -> bool:
    record = first_record(content)
    return record is not None and {"data_id", "model_A", "model_B"} <= set(record)


def battle_key(battle: Battle) -> str:
    return f"{battle.data_id}_{battle.model_A.name}_{battle.model_B.name}"


def _answer_file(path: Path, model: str, data_id: str) -> Path:
    return path.parent / f"{model}_output" / f"{data_id}.json"


def _read_output(file: Path) -> tuple[Output | None, str | None]:
    if not file.is_file():
        return None, f"{file}: {missing_file(file)} (each model's answer is <name>_output/<data_id>.json beside the battle file)"
    try:
        output = Output.model_validate(read_json(file))
        output.steps("input", 0), output.steps("output", 1)
    except InputError as err:
        return None, "; ".join(str(p) for p in err.problems)
    except (ValueError, IndexError, AttributeError) as err:
        return None, f"{file}: not an OpenING answer ({str(err).splitlines()[0]})"
    return output, None


def _text(step: Step, question: bool) -> str:
    text = (step.text or "").strip().replace("<image>", "")
    return text.replace("<BEGIN>", "") if question else text


def read(path: Path, image_root: Path, rubrics: dict[str, Rubric], criteria_file: Path | None = None) -> BenchmarkInput:
    records = read_records(path)
    if not records:
        raise InputError([Problem(str(path), "no battles")])
    parsed, problems = parse_records(path, records, Battle, "data_id")
    built, dropped = [], 0
    for index, battle in parsed:
        outputs = []
        for name in (battle.model_A.name, battle.model_B.name):
            output, problem = _read_output(_answer_file(path, name, str(battle.data_id)))
            if problem:
                problems.append(Problem(str(path), problem, index, battle_key(battle)))
            outputs.append(output)
        if None in outputs:
            continue
        answers = []
        for name, output in zip((battle.model_A.name, battle.model_B.name), outputs):
            folder = (path.parent / f"{name}_output").resolve()  # an answer's images are in its model's folder, not under --input_dir
            kept = [Segment(text=_text(step, False), image=str(folder / Path(step.image).name) if step.image and (folder / Path(step.image).name).is_file() else None)
                    for step in output.steps("output", 1)]
            dropped += sum(1 for step in output.steps("output", 1) if step.image) - sum(1 for s in kept if s.image)
            answers.append(kept)
        question = [Segment(text=_text(step, True), image=step.image) for step in outputs[0].steps("input", 0)]
        winner = battle.winner
        built.append((index, Pair(id=battle_key(battle), category=CATEGORY, group=outputs[0].meta_task_name, question=question,
                                  answer_a=answers[0], answer_b=answers[1], model_a=battle.model_A.name, model_b=battle.model_B.name,
                                  preference=verdict(winner))))
    notes = [f"{path}: {dropped} answer image(s) not found in their model's folder, left out as IntJudge leaves them out"] if dropped else []
    return pair_input(path, built, problems, image_root, rubrics, records, notes)


def write(bench: BenchmarkInput, results: dict[str, PairResult], output_dir: Path) -> list[Path]:
    judged = []
    for raw in bench.content:  # the records of the pairs read (pair_input), each battle once
        forward = judgements(results.get(battle_key(Battle.model_validate(raw))), "forward", "opening")
        # IntJudge's reading always names a winner; another verdict format's may name none, a battle its file leaves out
        if forward and forward[0].label is not None:
            judged.append({"data_id": raw["data_id"], "model_A": raw["model_A"], "model_B": raw["model_B"], "winner": forward[0].label})
    write_json_atomically(output_dir / RESULTS, judged)
    written = [output_dir / RESULTS]
    people = [raw for raw in bench.content if raw.get("winner") is not None]
    if people:
        write_json_atomically(output_dir / AGREEMENT, agreement(winners(people), winners(judged)))
        written.append(output_dir / AGREEMENT)
    rates = {rule: win_rates(judged, rule) for rule in WINRATE_CSVS}
    write_json_atomically(output_dir / WINRATES, {rule: overall for rule, (overall, _) in rates.items()})
    for rule, (overall, matrix) in rates.items():
        write_text_atomically(output_dir / WINRATE_CSVS[rule], winrate_csv(overall, matrix))
    return [*written, output_dir / WINRATES, *(output_dir / name for name in WINRATE_CSVS.values())]


# -- calculate_agreement.py's rules -------------------------------------------------------------------

def winners(battles: list[dict]) -> dict[str, str]:
    """Battle key -> winner, as calculate_agreement.py keys them (a later battle of the same key wins)."""
    return {f"{b['data_id']}_{b['model_A']['name']}_{b['model_B']['name']}": b["winner"] for b in battles}


def simplified(winner: str) -> str:
    return "Tie" if "tie" in winner.lower() else winner


def forced(winner: str) -> str:
    return {"Tie(A)": "A", "Tie(B)": "B", "Tie": "A"}.get(winner, winner)


RULES = {"force_divide": forced, "with_tie": simplified}


def _agree(human: dict[str, str], judge: dict[str, str], rule: str, keep=lambda key: True) -> dict:
    agree = total = 0
    for key, winner in human.items():
        if key not in judge or not keep(key):
            continue
        if rule == "without_tie":
            if "tie" in winner.lower() or "tie" in judge[key].lower():
                continue
            same = winner == judge[key]
        else:
            same = RULES[rule](winner) == RULES[rule](judge[key])
        total += 1
        agree += same
    return {"agreement": agree / total * 100 if total else 0, "total": total}


def _unseen(key: str) -> bool | None:
    parts = key.split("_")
    return None if len(parts) < 3 else any(model in UNSEEN_MODELS for model in parts[-2:])


def agreement(human: dict[str, str], judge: dict[str, str]) -> dict:
    """calculate_agreement.py's figures (module docstring), in percent; 0 where no battle counts, as it
    writes them. Its overall without-tie figure leaves out the battles people call a tie whether or not the
    judge judged them, and those the judge calls one; its per-type figures read the winners as they are."""
    figures = {}
    for rule in ("force_divide", "with_tie", "without_tie"):
        by_type = {"unseen_models": _agree(human, judge, rule, lambda key: _unseen(key) is True),
                   "seen_models": _agree(human, judge, rule, lambda key: _unseen(key) is False)}
        unseen, seen = by_type["unseen_models"]["agreement"], by_type["seen_models"]["agreement"]
        harmonic = 2 * (unseen * seen) / (unseen + seen) if unseen + seen else None
        figures[rule] = {**_agree(human, judge, rule), **by_type, "harmonic_mean": harmonic}
    return figures


# -- calculate_model_winrate.py's rules ---------------------------------------------------------------

def win_rates(battles: list[dict], rule: str) -> tuple[dict[str, float], dict[str, dict[str, str]]]:
    """Each model's overall win rate under one tie rule, best first (its sort: stable, by rate), and its
    win rate against each other model as calculate_model_winrate.py writes it ("12.50%" or "N/A")."""
    wins: dict[str, float] = {}
    matches: dict[str, int] = {}
    for b in battles:
        a, c, winner = b["model_A"]["name"], b["model_B"]["name"], b["winner"]
        tie = "Tie" in winner if rule in ("tie_zero", "tie_half") else False
        decisive = winner in ("A", "B")
        if rule == "without_tie" and not decisive:
            continue
        for model in (a, c):
            matches[model] = matches.get(model, 0) + 1
            wins.setdefault(model, 0)
        if rule == "force_divide":
            side = {"A": a, "Tie(A)": a, "B": c, "Tie(B)": c}.get(winner)
            if side:
                wins[side] += 1
        elif decisive:
            wins[a if winner == "A" else c] += 1
        elif rule == "tie_half" and tie:
            wins[a] += 0.5
            wins[c] += 0.5
    overall = {m: wins[m] / matches[m] if matches[m] else 0 for m in matches}
    order = sorted(overall, key=overall.get, reverse=True)
    matrix = {m: {o: "N/A" if o == m else _head_to_head(battles, m, o, rule) for o in order} for m in order}
    return {m: overall[m] for m in order}, matrix


def _head_to_head(battles: list[dict], model: str, other: str, rule: str) -> str:
    wins = matches = 0
    for b in battles:
        a, c, winner = b["model_A"]["name"], b["model_B"]["name"], b["winner"]
        if {a, c} != {model, other}:
            continue
        if rule == "force_divide":
            matches += 1
            wins += (a == model and winner in ("A", "Tie(A)")) or (c == model and winner in ("B", "Tie(B)"))
        else:
            matches += 1
            wins += (winner == "A" and a == model) or (winner == "B" and c == model)
            if rule == "tie_half" and "Tie" in winner:
                wins += 0.5
    return f"{wins / matches:.2%}" if matches else "N/A"


def winrate_csv(overall: dict[str, float], matrix: dict[str, dict[str, str]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["Model", *map(spreadsheet_cell, overall)])
    for model in overall:
        writer.writerow([spreadsheet_cell(model), *(matrix[model][other] for other in overall)])
    return out.getvalue()


def verdict(winner: str | None) -> str | None:
    """A winner (validated by Battle) as the toolkit's verdict: A, B, or any tie (Tie(A), Tie(B), Tie) a tie."""
    if winner is None:
        return None
    return "tie" if winner[:3].lower() == "tie" else winner


def read_preferences(path: str, content: object) -> PreferenceFile:
    """The winners of a battle file, people's (judge_modelAB_results.json) or a judge's (IntJudge's or
    judge-score's results), for judge-calibrate; a tie keeps the answer it leans to."""
    def preference(b: Battle) -> Preference:
        lean = b.winner[4] if b.winner in ("Tie(A)", "Tie(B)") else None
        return Preference(battle_key(b), verdict(b.winner), b.model_A.name, b.model_B.name, lean=lean)
    return preferences_of(path, content, Battle, preference, "data_id")


FORMAT = Format("opening", (), looks_like, read, write, (RESULTS, AGREEMENT, WINRATES, *WINRATE_CSVS.values()),
                prompt_source="OpenING/IntJudge_judge_AB.py", read_preferences=read_preferences)
