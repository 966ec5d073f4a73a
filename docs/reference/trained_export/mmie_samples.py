"""MMIE-format samples (data.json and images; 0-1 question and 0-1 answer images, 20-900 words of text) whose
answers end with EXTRA[id] more words " the" (one token each), to put prompts where a test wants them.
usage: mmie_samples.py DATA_DIR N SEED [EXTRA.json]"""
import json, random, sys
from pathlib import Path
from mmjudge.judge.testing.synthetic import _draw_image
from mmjudge.judge.testing.checkpoints import CORPUS_WORDS

out, n, seed = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
extra = json.loads(Path(sys.argv[4]).read_text()) if len(sys.argv) > 4 else {}
rng = random.Random(seed)
(out / "images").mkdir(parents=True, exist_ok=True)
words = CORPUS_WORDS + ["zebra", "quixotic", "Ångström", "naïve", "42", "x²", "—", "fjord"]
records = []
for i in range(1, n + 1):
    sid = f"{('SA', 'PBL', 'MSR')[i % 3]}_{i:04d}"
    def text(k): return " ".join(rng.choice(words) for _ in range(k)).capitalize() + "."
    question = [{"text": text(rng.randint(20, 120)), "image": None}]
    for k in range(rng.randint(0, 1)):
        name = f"images/q_{i:04d}_{k}.{rng.choice(['png', 'jpg'])}"; _draw_image(rng, out / name)
        question.append({"text": None, "image": name})
    answer = [{"text": text(rng.randint(40, 900)), "image": None}]
    for k in range(rng.randint(0, 1)):
        name = f"images/a_{i:04d}_{k}.{rng.choice(['png', 'jpg'])}"; _draw_image(rng, out / name)
        answer.append({"text": text(rng.randint(3, 20)), "image": name})
    answer.append({"text": "Overall, this answer is good." + " the" * extra.get(sid, 0), "image": None})
    records.append({"id": sid, "model": "m", "question": question, "answer": answer, "gt_answer": [{"text": text(8), "image": None}]})
(out / "data.json").write_text(json.dumps(records, indent=1))
