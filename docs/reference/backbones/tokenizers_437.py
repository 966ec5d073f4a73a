"""The tokenizers of InternVL2-2B/8B (InternLM2's, its remote-code class) and InternVL2-1B/InternVL3 (Qwen2's slow
class) as InternVL's chat() and MMIE's main.py use them (transformers 4.37.2, use_fast=False), on the tiny
checkpoints' tokenizer files: the ids of texts (special tokens and InternVL's image tokens among them) and the text
of random id sequences (byte pieces, added and special tokens among them), decoded skipping special tokens.
Run in the reference venv; mmjudge's tests check their own tokenizers against the file it writes.
usage: tokenizers_437.py INTERNLM2_TOKENIZER_DIR QWEN2_TOKENIZER_DIR OUT.json"""
import json
import random
import sys

from transformers import AutoTokenizer

texts = [
    "<|im_start|>system\nYou are a judge.<|im_end|><|im_start|>user\nImage-0: <img><IMG_CONTEXT><IMG_CONTEXT></img>\nRate it.<|im_end|><|im_start|>assistant\n",
    "Hello world", " Hello  world ", "\nnew line first", "x²  naïve — Ångström 日本 🙂", "### Score\n4", "a\tb\rc", "   ", "",
    "<|im_end|>text right after", "text<|im_start|>", "<img></img><IMG_CONTEXT>", "the answer is 42.", "Überprüfung der Antwort",
]
rng = random.Random(0)
words = ["the", "answer", "image", "score", "quality", "ok", "zebra", "é", "日", "12", "!", ",", " ", "\n", "<|im_start|>", "<img>", "<IMG_CONTEXT>"]
texts += ["".join(rng.choice(words) + rng.choice(["", " ", "\n"]) for _ in range(rng.randint(1, 30))) for _ in range(40)]
out = {}
for name, path in (("internlm2", sys.argv[1]), ("qwen2", sys.argv[2])):
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True, use_fast=False)
    size = len(tokenizer)
    ids = [[rng.randrange(size) for _ in range(rng.randint(1, 40))] for _ in range(150)]
    out[name] = {"tokenizer_class": type(tokenizer).__name__, "encode": [[text, tokenizer(text).input_ids] for text in texts],
                 "decode": [[sequence, tokenizer.decode(sequence, skip_special_tokens=True)] for sequence in ids]}
with open(sys.argv[3], "w", encoding="utf-8") as f:
    json.dump(out, f, ensure_ascii=False)
print({name: (len(v["encode"]), len(v["decode"])) for name, v in out.items()})
