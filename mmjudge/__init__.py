"""mmjudge: fine-tuned multimodal judge models: score, train, calibrate, serve.

    import mmjudge

    judge = mmjudge.Judge.load("OpenGVLab/InternVL2-4B")    # once; a Hub id, a local folder or a judge-train output
    records = judge.score(samples)                           # MMIE-shaped dicts, Samples or a file: judge-score's records
    verdicts = judge.compare(pairs)                          # pairs of answers, each judged in both orders
    report = mmjudge.calibrate(records, "annotations.json")  # agreement with people
    mmjudge.fine_tune("OpenGVLab/InternVL2-4B", "train.json", "my-judge", config="tiny")

The API is in mmjudge/api.py (docs/api.md); the command lines (judge-score, judge-train, judge-calibrate,
judge-serve) are doors to the same engine. The names below load on first use, so `import mmjudge` costs
nothing and loads no torch; `calibrate` never does.

The repository's top-level folders are this package's subpackages: judge/ (the core every command shares),
infer/ (judge-score), train/ (judge-train), calibration/ (judge-calibrate), serve/ (judge-serve), demo/
(judge-demo) and configs/ (rubrics and presets, as data). (The training function is `fine_tune`: the name
`mmjudge.train` is the subpackage's.)"""

from importlib import import_module

__all__ = ["Judge", "Sample", "ScoreOptions", "ScoreRecord", "VerdictRecord", "TrainConfig", "TrainResult", "Report", "calibrate", "fine_tune",
           "__version__"]

# Where each public name is defined, imported when first asked for.
_DEFINED_IN = {
    "Judge": "mmjudge.api",  # a judge loaded once: .score(samples), .compare(pairs), .score_one(question, answer, images)
    "calibrate": "mmjudge.api",  # agreement with people and calibration maps: a Report
    "fine_tune": "mmjudge.api",  # judge-train's recipe: a TrainResult
    "TrainResult": "mmjudge.api",
    "ScoreRecord": "mmjudge.api",  # what .score returns per sample: a typed dict, judge-score's record
    "VerdictRecord": "mmjudge.api",  # what .compare returns per pair
    "Sample": "mmjudge.judge.data",  # an MMIE sample: question, answer, category
    "ScoreOptions": "mmjudge.infer.options",  # how a judge scores (Judge.load's keywords)
    "TrainConfig": "mmjudge.train.config",  # the training settings (fine_tune's keywords)
    "Report": "mmjudge.calibration.analysis",  # what calibrate returns, report.json's content
}


def __getattr__(name: str):
    if name == "__version__":
        from mmjudge.judge.cli import package_version

        value = package_version()
    elif name in _DEFINED_IN:
        value = getattr(import_module(_DEFINED_IN[name]), name)
    else:
        raise AttributeError(f"module 'mmjudge' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
