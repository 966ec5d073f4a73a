"""judge-score's eval_result.json against the reference's answers on MMIE main.py's path (ref_steps.pt), also
counting the reference's answers that hold an image token (IMAGE_TOKENS: the tiny tokenizer's <img>, </img>,
<IMG_CONTEXT>) and how many of those judge-score gave.
usage: compare_answers.py EVAL_RESULT.json REF_STEPS.pt VOCAB_SIZE_OF_TOKENIZER"""
import json, sys
import torch
IMAGE_TOKENS = (1211, 1212, 1213)
ours = {r["id"]: r for r in json.loads(open(sys.argv[1]).read())}
ref = torch.load(sys.argv[2])
n_tokenizer = int(sys.argv[3])
same = failed = 0
imaged = [r for r in ref if any(t in IMAGE_TOKENS for t in r["tokens"])]
longer = sum(ours[r["id"]]["prompt_tokens"] != r["prompt_tokens"] for r in ref)
for r in ref:
    o = ours[r["id"]]
    if r["response"].startswith("<decode failed"):
        step = next(k for k, t in enumerate(r["tokens"]) if t >= n_tokenizer)
        failed += 1
        print(f"{r['id']}: the reference wrote token {r['tokens'][step]} (no token of the tokenizer's {n_tokenizer}) at step {step}: "
              f"MMIE's main.py stops there (IndexError in decode)")
    elif o["feedback"].strip() == r["response"].strip():  # chat() strips its answer (issue 22 item 1, another branch)
        same += 1
    else:
        print(f"{r['id']}: DIFFERENT {o['feedback'][:60]!r} | {r['response'][:60]!r}")
print(f"same answer: {same} of {len(ref) - failed} ({failed} where the reference's decode fails); prompts of another length than the reference's: {longer} of {len(ref)}")
if imaged:
    tokens = sum(t in IMAGE_TOKENS for r in imaged for t in r["tokens"])
    equal = sum(ours[r["id"]]["feedback"].strip() == r["response"].strip() for r in imaged)
    print(f"the reference wrote image tokens in {len(imaged)} answers ({tokens} tokens): the same answer in {equal} of {len(imaged)}")
