"""Compare mmjudge's side (ours.py) with a reference's (internvl_reference.py, hf_reference.py), sample by sample:
the prompt's token ids, the pixels (where the reference made its own), each generated token and its step's
logits, and the answer's text, for mmjudge at its default batching and alone (--token_budget 1).
Where the reference writes a token mmjudge never writes (a row of the output layer past the tokenizer, an image
token), the comparison stops at that step and the sample is counted apart.
usage: compare.py OURS.pt REFERENCE.pt [SWITCH]   (SWITCH: a rope switch, to count prompts on each side of it)"""
import sys

import torch

ours, reference = torch.load(sys.argv[1]), {r["id"]: r for r in torch.load(sys.argv[2])}
switch = int(sys.argv[3]) if len(sys.argv) > 3 else None
unwritable = set(ours["unwritable"])
counts = {"samples": 0, "ids equal": 0, "pixels compared": 0, "grids equal": 0, "texts equal": 0, "tokens equal": 0, "reference writes an unwritable token": 0,
          "batched equals alone": 0, "steps compared": 0}
largest_logit, largest_pixel, below, above = 0.0, 0.0, 0, 0
for record in ours["records"]:
    ref = reference[record["id"]]
    counts["samples"] += 1
    counts["ids equal"] += ref["input_ids"].tolist() == record["input_ids"].tolist()
    if ref.get("pixels") is not None:
        counts["pixels compared"] += 1
        if ref["pixels"].shape != record["pixels"].shape:
            raise SystemExit(f"{record['id']}: pixels of shape {tuple(ref['pixels'].shape)}, mmjudge's {tuple(record['pixels'].shape)}")
        largest_pixel = max(largest_pixel, (ref["pixels"].float() - record["pixels"]).abs().max().item())
        counts["grids equal"] += ref.get("grids") is None or torch.equal(ref["grids"], record["grids"])
    if switch is not None:
        below, above = below + (len(record["input_ids"]) <= switch), above + (len(record["input_ids"]) > switch)
    batched, alone = record["batched"], record["alone"]
    counts["batched equals alone"] += batched["tokens"] == alone["tokens"] and batched["text"] == alone["text"] \
        and torch.allclose(batched["logits"], alone["logits"], rtol=0, atol=1e-5)
    tokens = ref["tokens"]
    cut = next((k for k, t in enumerate(tokens) if t in unwritable), None)
    if cut is not None:
        counts["reference writes an unwritable token"] += 1
        tokens = tokens[:cut]
    mine = batched["tokens"][: len(tokens)] if cut is not None else batched["tokens"]
    counts["tokens equal"] += mine == tokens
    steps = min(len(tokens), len(batched["tokens"]))
    if steps:
        counts["steps compared"] += steps
        largest_logit = max(largest_logit, (ref["logits"][:steps].float() - batched["logits"][:steps]).abs().max().item())
    if cut is None:
        counts["texts equal"] += ref["text"] == batched["text"]
print(", ".join(f"{k}: {v}" for k, v in counts.items()))
print(f"largest |logit difference| {largest_logit:.3g}" + (f", largest |pixel difference| {largest_pixel:.3g}" if counts["pixels compared"] else "")
      + (f"; prompts at or below the switch at {switch}: {below}, above: {above}" if switch is not None else ""))
