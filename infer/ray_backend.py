"""judge-score --ray ADDRESS: the run's samples judged on a Ray cluster as one Ray Data job, each actor a judge
(mmjudge.ray.data.Scorer: `mmjudge.Judge`, the engine the local backend runs), while this process reads the input,
keeps the journal and writes the same result files as without --ray (infer/run.py). Ray places the actors,
scales them between --ray_actors MIN:MAX, restarts one that dies and runs its batch again, as often as it takes
(Ray Data's max_restarts and max_task_retries, -1: set per job only through map_batches' ray_remote_args, which
Ray 2.60 deprecates); nothing here schedules.

The journal's settings are the local backend's (journal_settings), so a run with --ray resumes one without and the
reverse. Images are read by path on the actors' nodes: on several machines the input folder, like the judge's
folder, must be at the same path on each (or the judge a Hub id), as with torchrun's ranks.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path

from mmjudge.infer.batch_invariant import deterministic_on
from mmjudge.infer.engine import read_tokens
from mmjudge.infer.local_backend import journal_settings
from mmjudge.infer.loaded import find_checkpoint
from mmjudge.infer.options import ScoreOptions, preset
from mmjudge.infer.progress import Bar
from mmjudge.judge.data import InputError, JudgeResult, Pair, PairResult, Problem, Sample
from mmjudge.judge.formats import Format
from mmjudge.judge.identity import weights_fingerprint
from mmjudge.judge.model import judge_tokenizer, unloaded_settings, weight_files, with_max_tiles
from mmjudge.judge.parquet import SEGMENT_FIELDS, image_cache, row_of
from mmjudge.judge.prompts import Rubric

class RayBackend:
    """Finds the checkpoint and reads what the journal needs of it (no weights) when made; joins or starts the
    cluster in `load`; runs the Ray Data job in `score`."""

    def __init__(self, args, options: ScoreOptions, rubrics: dict[str, Rubric], fmt: Format):
        self.model_dir = find_checkpoint(args.model_path, args.revision).path
        self.judge_fingerprint = weights_fingerprint(weight_files(self.model_dir))
        tokenizer = judge_tokenizer(self.model_dir)
        if options.mode == "logits":  # what the judge's tokenizer cannot read is refused before any actor starts
            read_tokens(tokenizer, rubrics, options.mode)
        self.settings = with_max_tiles(unloaded_settings(self.model_dir, tokenizer)[0], options.max_tiles)
        self.args, self.options = args, options
        given = {f.name: getattr(args, f.name) for f in fields(ScoreOptions) if getattr(args, f.name, None) is not None}
        # What each actor loads: the judge by the name given (a Hub id is fetched on each node), paths made absolute
        # (an actor's working directory is not this one's), and the options as this run resolved them, from the same
        # preset or --config and flags.
        self.judge = {"model_path": absolute(args.model_path), "revision": args.revision, "device": args.device, "dtype": args.dtype,
                      "input_dir": str(Path(args.input_dir).resolve()), "rubrics": [absolute(r) for r in args.rubric or fmt.default_rubrics],
                      "config": absolute(args.config or preset(fmt.name)), **given}
        self.deterministic = False
        self.started = False

    def load(self) -> dict:
        """The cluster joined (or started: --ray local); what of the judge a journal's results depend on."""
        import ray

        if not ray.is_initialized():  # a program that called judge-score's main already connected keeps its cluster
            local = {"_node_ip_address": "127.0.0.1"} if self.args.ray == "local" else {}
            ray.init(address=self.args.ray, include_dashboard=False, logging_level=logging.WARNING, **local)
            self.started = True
        ray.data.DataContext.get_current().enable_progress_bars = False  # judge-score's own bar counts the samples
        logging.getLogger("ray.data").setLevel(logging.WARNING)  # and the summary says the rest
        gpus = self.args.ray_gpus if self.args.ray_gpus is not None else (1 if ray.cluster_resources().get("GPU", 0) else 0)
        self.gpus = gpus
        device = self.args.device or ("cuda" if gpus else "cpu")
        self.deterministic = deterministic_on(device, self.options.deterministic)
        dtype = self.args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
        return journal_settings(self.model_dir, f"torch.{dtype}", self.settings, self.options, self.deterministic)

    def score(self, samples: list[tuple[int, Sample | Pair]], bar: Callable[[str], Bar]) -> Iterator[list[JudgeResult | PairResult]]:
        """The samples as rows of a Dataset, judged by the actors; their results a block at a time as they come back.
        Rows an actor could not judge are named together at the end (an InputError), after the others are journaled."""
        import ray

        from mmjudge.ray.data import ERROR, Scorer, result

        if not samples:
            return
        rows = ray.data.from_items([carrying_cached_images(row_of(sample)) for _, sample in samples])
        judged = rows.map_batches(Scorer, fn_constructor_kwargs=self.judge, compute=actor_pool(self.args.ray_actors),
                                  num_cpus=self.args.ray_cpus, num_gpus=self.gpus, batch_size=self.args.ray_batch_size)
        failed = {}
        with bar("scoring") as scoring:
            for block in judged.iter_batches(batch_size=None, batch_format="pyarrow"):
                block = block.to_pylist()
                failed.update({row["id"]: row[ERROR] for row in block if row[ERROR] is not None})
                yield [result(row) for row in block if row[ERROR] is None]
                scoring.update(len(block))
        if failed:  # an input problem only an actor's node sees (an image missing there), each named by its record
            index = {sample.id: i for i, sample in samples}
            raise InputError([Problem(self.args.input_file, f"not judged on the Ray cluster, {error} (the other samples' results are in "
                                                            "the journal: a rerun judges only these)", index.get(sample_id), sample_id)
                              for sample_id, error in failed.items()])

    def warnings(self, results: list[JudgeResult]) -> list[str]:
        return []

    def close(self) -> None:
        if self.started:
            import ray

            ray.shutdown()


def carrying_cached_images(row: dict) -> dict:
    """A row whose images the input file held (a Parquet file's bytes, written to this machine's image cache as it was
    read) go in it, as data URLs: an actor on another node has no such file."""
    cache = image_cache()

    def segment(value: dict) -> dict:
        image = value.get("image")
        if image is None or Path(image).parent != cache:
            return value
        return {**value, "image": f"data:image/{Path(image).suffix[1:]};base64,{base64.b64encode(Path(image).read_bytes()).decode()}"}

    return {key: [segment(value) for value in values] if key in SEGMENT_FIELDS else values for key, values in row.items()}


def absolute(path: str | Path | None) -> str | None:
    """A path that exists here, absolute; anything else (a Hub id, a bundled file's name) as given."""
    return None if path is None else str(Path(path).resolve()) if Path(path).exists() else str(path)


def actor_pool(spec: str):
    """--ray_actors as Ray Data's pool of actors: N of them, or from MIN to MAX (MIN:MAX), scaled by Ray Data."""
    import ray

    low, _, high = spec.partition(":")
    return ray.data.ActorPoolStrategy(min_size=int(low), max_size=int(high)) if high else ray.data.ActorPoolStrategy(size=int(low))
