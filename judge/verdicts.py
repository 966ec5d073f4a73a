"""A pairwise judge's verdict, both ways: how each convention writes it (training targets) and how it is
read back (judging), one `VerdictFormat` per convention. Keeping both here, as judge/parsing.py does for
scores, is what guarantees that a trained judge's verdict parses.

    format         the judge writes                                       read as (the convention's own rule)
    mmjudge        a critique, "<criterion>: A|B|tie" lines,             the first A, B or tie after the heading
                   "### Verdict" and the verdict on the next line
    brackets       "... [[A]]" or "[[B]]" ("[[C]]": a tie)                "[[A]]" anywhere, else "[[B]]", else "[[C]]"
                   (Multimodal RewardBench, MT-Bench)
    vlrewardbench  "... Overall Judgment: Answer 1 is better"             VL-RewardBench's regular expression, on the text
                                                                          less its newlines and asterisks
    mmrb2          a JSON object whose "better_response" is "A" or "B"   that value, code fences stripped (MMRB2)
    opening        "A is better", "B is better", "Tie(A is better)" ...  IntJudge's rule: the first character, a "tie"
                                                                          start, else the first A or B in the text
    think          "<think>...</think><answer>A</answer>" (a reasoning    the A, B or tie inside <answer>, and only where the
                   judge's, UnifiedReward-Think's and R1-Reward's)        whole output is that layout

A reading is positional: "A" is the answer shown first, whichever of the pair's answers that was; the
scoring engine turns it into the pair's terms. `label` is the verdict as the benchmark names it
("Answer 2" is "2", OpenING's "Tie(A)"), which its own metric reads; `offset` is where in the text the
verdict's character stands, so that its probability distribution can be read at the token that wrote it.

A verdict's distribution is read over one token per verdict: the token each verdict starts with right after
`context`, the text that precedes it. `forced` is what the engine feeds after an output whose verdict does
not parse (as it feeds "### Score" after an unparsed score), to read the distribution there; and, without
its leading newline, what logits mode appends to the prompt.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field

VERDICT_HEADING = "### Verdict"


@dataclass(frozen=True)
class Reading:
    verdict: str | None  # "A" (the answer shown first), "B" or "tie"; None where the output gives none
    label: str | None  # as the convention names it
    offset: int | None = None  # of the verdict's character in the text; None where no token wrote it
    criteria: dict[str, str | None] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True)
class VerdictFormat:
    name: str
    context: str  # what precedes the verdict's token
    options: dict[str, str]  # verdict -> what the judge writes for it after `context`
    forced: str | None  # fed after an unparsed output to read the verdict there; None: the convention has no heading to force
    read: Callable[[str, dict[str, str]], Reading]  # (text, criterion labels) -> reading
    write: Callable[[str, dict[str, str], dict[str, str], str | None], str]  # (verdict, criteria, labels, rationale) -> text

    @property
    def logits_prefix(self) -> str:
        """What logits mode appends to the prompt before reading the verdict's distribution."""
        return (self.forced or "").lstrip("\n")


def _unwritable(name: str, verdict: str) -> ValueError:
    return ValueError(f"the {name} verdict format has no way to write {verdict!r}")


def _rationale(rationale: str | None) -> list[str]:
    return [rationale.strip()] if rationale and rationale.strip() else []


# -- mmjudge: the toolkit's own ------------------------------------------------------------------------

_WORD = re.compile(r"[\s*\[]*(A|B|tie)\b", re.IGNORECASE)


def _criterion_verdict(label: str) -> re.Pattern:
    # Tolerates the markdown judges like to add, as the score lines do: "- **Text quality**: A".
    return re.compile(rf"^[\s*#-]*{re.escape(label)}\**\s*[:：]\s*\**\s*(A|B|tie)\b", re.IGNORECASE | re.MULTILINE)


def _normal(word: str) -> str:
    return "tie" if word.lower() == "tie" else word.upper()


def read_mmjudge(text: str, labels: dict[str, str]) -> Reading:
    head, found, tail = text.partition(VERDICT_HEADING)
    criteria = {}
    for name, label in labels.items():
        words = [m.group(1) for m in _criterion_verdict(label).finditer(head)]  # the last line wins: a judge corrects itself
        criteria[name] = _normal(words[-1]) if words else None
    if not found:
        return Reading(None, None, None, criteria, f"no '{VERDICT_HEADING}' heading in the judge's output")
    if (match := _WORD.match(tail)) is None:
        return Reading(None, None, None, criteria, f"no A, B or tie after '{VERDICT_HEADING}'")
    verdict = _normal(match.group(1))
    return Reading(verdict, verdict, len(head) + len(found) + match.start(1), criteria)


def write_mmjudge(verdict: str, criteria: dict[str, str], labels: dict[str, str], rationale: str | None) -> str:
    lines = _rationale(rationale) + [f"{labels[name]}: {value}" for name, value in criteria.items()]
    return "\n".join([*lines, VERDICT_HEADING, verdict])


# -- brackets: Multimodal RewardBench's (and MT-Bench's) -------------------------------------------------

_BRACKETS = {"A": "[[A]]", "B": "[[B]]", "tie": "[[C]]"}  # looked for in this order


def read_brackets(text: str, labels: dict[str, str]) -> Reading:
    for verdict, mark in _BRACKETS.items():
        if (at := text.find(mark)) >= 0:
            return Reading(verdict, mark[2], at + 2)
    return Reading(None, None, error="no [[A]], [[B]] or [[C]] in the judge's output")


def write_brackets(verdict: str, criteria: dict[str, str], labels: dict[str, str], rationale: str | None) -> str:
    return "\n\n".join(_rationale(rationale) + [_BRACKETS[verdict]])


# -- vlrewardbench ------------------------------------------------------------------------------------

# VL-RewardBench's rule (inference_hf.py and cal.py): searched, case-insensitively, in the output with its
# newlines and asterisks removed; the greedy ".*" takes the last "Answer N is better" after the first
# "Overall Judgment" or "Therefore".
VLRB_PATTERN = re.compile(r"(?:Overall Judgment|Therefore)\s*.*\s*-*\s*Answer\s*(\d+)\s*is\s*(?:the\s*)?(?:slightly\s*)?better", re.IGNORECASE)


def read_vlrewardbench(text: str, labels: dict[str, str]) -> Reading:
    kept = [k for k, c in enumerate(text) if c not in "\n*"]  # where each character of the searched text comes from
    match = VLRB_PATTERN.search("".join(text[k] for k in kept))
    if match is None:
        return Reading(None, None, error="no 'Overall Judgment ... Answer N is better' in the judge's output")
    number = match.group(1)
    verdict = {"1": "A", "2": "B"}.get(number)
    error = None if verdict else f"'Answer {number}' names neither answer (1 or 2)"
    return Reading(verdict, number, kept[match.start(1)] if verdict else None, error=error)


def write_vlrewardbench(verdict: str, criteria: dict[str, str], labels: dict[str, str], rationale: str | None) -> str:
    if verdict == "tie":
        raise _unwritable("vlrewardbench", verdict)
    return "\n\n".join(_rationale(rationale) + [f"Overall Judgment: Answer {1 if verdict == 'A' else 2} is better."])


# -- mmrb2 --------------------------------------------------------------------------------------------

_FENCE_START, _FENCE_END = re.compile(r"^```(?:json)?\s*\n?"), re.compile(r"\n?```\s*$")
# where the verdict's letter stands, in double quotes, single quotes or none (json_repair reads all three)
_BETTER = re.compile(r"""["']better_response["']\s*:\s*["']?(\w*)""")


def mmrb2_json(text: str) -> object:
    """The judge's JSON as MMRB2's evaluators read it (parse_llm_json): code fences stripped, then json_repair,
    which also takes single quotes, a bare letter, a missing brace or text around the object; None where that
    fails."""
    import json_repair  # only MMRB2's reading needs it

    body = _FENCE_END.sub("", _FENCE_START.sub("", text.strip()).strip())
    try:
        return json_repair.loads(body)
    except Exception:  # noqa: BLE001 - MMRB2's evaluate.py takes any failure of the parse as no judgement
        return None


def read_mmrb2(text: str, labels: dict[str, str]) -> Reading:
    """MMRB2's reading: the better_response of the judge's JSON (`mmrb2_json`), whatever value it holds; none
    where the JSON is no object or has no better_response (its evaluator fails there), or where the value is
    empty (its scorer counts no such judgement). A value other than "A" or "B" is a judgement that is never
    right, its label the value as JSON writes it (`1` for 1)."""
    parsed = mmrb2_json(text)
    value = parsed.get("better_response") if isinstance(parsed, dict) else None
    if not value:
        return Reading(None, None, error="no \"better_response\" in the judge's JSON")
    label = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if value not in ("A", "B"):
        return Reading(None, label, error=f"better_response {value!r} is neither A nor B")
    at = next((m.start(1) for m in _BETTER.finditer(text) if m.group(1) == value), None)
    return Reading(value, value, at)


def write_mmrb2(verdict: str, criteria: dict[str, str], labels: dict[str, str], rationale: str | None) -> str:
    if verdict == "tie":
        raise _unwritable("mmrb2", verdict)
    return json.dumps({"reasoning": (rationale or "").strip(), "better_response": verdict}, ensure_ascii=False, indent=4)


# -- opening: IntJudge's ------------------------------------------------------------------------------

def read_opening(text: str, labels: dict[str, str]) -> Reading:
    """IntJudge_judge_AB.py's rule: "A..." or "B..." is that answer; "tie..." is a tie, named by its first five
    characters and a ")" ("Tie(A)"); otherwise a tie leaning to the first A or B the text holds, else to one
    drawn at random (here drawn from the text itself, so that a rerun draws the same)."""
    if text[:1] in ("A", "B"):
        return Reading(text[0], text[0], 0)
    if text[:3].lower() == "tie":
        return Reading("tie", text[:5] + ")", 0)
    lean = next((c for c in text if c in "AB"), None)
    if lean is not None:
        return Reading("tie", f"Tie({lean})")
    drawn = random.Random(text).choice("AB")
    return Reading(None, f"Tie({drawn})", error=f"no A, B or tie in the judge's output (OpenING's rule draws Tie({drawn}))")


def write_opening(verdict: str, criteria: dict[str, str], labels: dict[str, str], rationale: str | None) -> str:
    if verdict == "tie":  # IntJudge's ties lean to one answer ("Tie(A is better)"); a plain tie names none
        raise _unwritable("opening", verdict)
    return f"{verdict} is better"


# -- think: a reasoning judge's (UnifiedReward-Think, R1-Reward) -------------------------------------------

# The whole output, nothing before <think> or after </answer>: a reasoning judge trained by RL is rewarded
# for this layout (train/grpo_rewards.py), so a verdict found elsewhere in a broken layout is no verdict.
_THINK = re.compile(r"\s*<think>(.*?)</think>\s*<answer>\s*(A|B|tie)\s*</answer>\s*", re.IGNORECASE | re.DOTALL)


def read_think(text: str, labels: dict[str, str]) -> Reading:
    if (match := _THINK.fullmatch(text)) is None:
        return Reading(None, None, error="the judge's output is not <think>...</think><answer>A, B or tie</answer>")
    verdict = _normal(match.group(2))
    return Reading(verdict, verdict, match.start(2))


def write_think(verdict: str, criteria: dict[str, str], labels: dict[str, str], rationale: str | None) -> str:
    return f"<think>{(rationale or '').strip()}</think>\n<answer>{verdict}</answer>"


VERDICT_FORMATS: dict[str, VerdictFormat] = {f.name: f for f in (
    VerdictFormat("mmjudge", f"\n{VERDICT_HEADING}\n", {"A": "A", "B": "B", "tie": "tie"}, f"\n{VERDICT_HEADING}\n", read_mmjudge, write_mmjudge),
    VerdictFormat("brackets", "[[", {"A": "A", "B": "B", "tie": "C"}, "\n[[", read_brackets, write_brackets),
    VerdictFormat("vlrewardbench", "Answer", {"A": " 1", "B": " 2"}, "\nOverall Judgment: Answer", read_vlrewardbench, write_vlrewardbench),
    VerdictFormat("mmrb2", '"better_response": "', {"A": "A", "B": "B"}, '\n{"better_response": "', read_mmrb2, write_mmrb2),
    VerdictFormat("opening", "\n", {"A": "A", "B": "B", "tie": "Tie"}, None, read_opening, write_opening),
    VerdictFormat("think", "<answer>", {"A": "A", "B": "B", "tie": "tie"}, "\n<answer>", read_think, write_think),
)}
