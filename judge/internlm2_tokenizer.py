"""InternLM2's tokenizer (InternVL2-2B/8B, InternVL2.5-2B/8B), which its checkpoints ship as remote code
(`tokenization_internlm2.py`, named by tokenizer_config.json's "tokenizer_class": "InternLM2Tokenizer") and
transformers does not implement: this toolkit runs no checkpoint's code, so it carries the rule itself.

It is a SentencePiece BPE tokenizer over the checkpoint's `tokenizer.model`, as the reference (InternVL's chat,
MMIE's main.py: the slow tokenizer, `use_fast=False`) encodes with transformers 4.37:

- the text is split at the added tokens (tokenizer_config.json's added_tokens_decoder: InternLM2's `<|im_start|>`,
  `<|im_end|>`... at ids inside the SentencePiece vocabulary, whose own pieces there are placeholders, and
  InternVL's `<img>`, `<IMG_CONTEXT>`... after it), which become their ids;
- every other piece of text is encoded by SentencePiece as the model file says (its own dummy word-start prefix,
  where the model has one, before each piece of text);
- the BOS token `<s>` goes first (add_bos_token), no EOS after.

Decoding as the reference decodes is judge/detokenize.py's (`text_decoder`).
"""

from __future__ import annotations

from transformers.tokenization_utils_sentencepiece import SentencePieceBackend


class InternLM2Tokenizer(SentencePieceBackend):
    vocab_files_names = {"vocab_file": "tokenizer.model"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file: str, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="</s>", add_bos_token: bool = True,
                 add_eos_token: bool = False, clean_up_tokenization_spaces: bool = False, **kwargs):
        # legacy: SentencePiece encodes each piece of text with the model file's own normalizer, as the reference's _tokenize does
        kwargs["sp_model_kwargs"] = kwargs.get("sp_model_kwargs") or {}  # the released config says null
        kwargs.update(legacy=True, special_tokens_pattern={(True, False): "bos", (True, True): "bos_eos", (False, True): "eos"}.get(
            (add_bos_token, add_eos_token), "none"))
        self.add_bos_token, self.add_eos_token = add_bos_token, add_eos_token
        super().__init__(vocab_file=vocab_file, unk_token=unk_token, bos_token=bos_token, eos_token=eos_token, pad_token=pad_token,
                         add_bos_token=add_bos_token, add_eos_token=add_eos_token,
                         clean_up_tokenization_spaces=clean_up_tokenization_spaces, **kwargs)
