"""The tokenizer files `convert --to=hf` writes, so that transformers'
`AutoTokenizer.from_pretrained(HF_DIR)` gives the ids bertjax gives.

  files = hf_tokenizer.files_for(tokenizer, architecture="bert", max_length=512)
  # {file name: bytes}: tokenizer.json, tokenizer_config.json, special_tokens_map.json, ...

bertjax's tokenizer (`bertjax.tokenization`) becomes a `tokenizers` pipeline in tokenizer.json:
- sentencepiece (vocab.model, unigram or BPE): the model's own normalizer (its precompiled NFKC
  table, the text stripped and runs of spaces made one when the model says so, "▁" before the
  text and for each space), then its pieces with their scores (unigram) or its pieces and the
  merges they imply (BPE, sentencepiece's rule: a longer piece's score ranks its merge), byte
  fallback as the model has it. vocab.model is written beside it for the user's reference.
- WordPiece (vocab.txt): Google's BasicTokenizer as the tokenizers library has it (invalid and
  control characters dropped, CJK characters split, lower case and accents stripped when
  uncased, punctuation split), the pieces and the longest word bertjax splits; vocab.txt too.
- byte-level BPE (ModernBERT's tokenizer.json): the file as it is; its post-processor is
  ModernBERT's.
Each kind gets BERT's post-processor ([CLS] A [SEP], and [CLS] A [SEP] B [SEP] with token types
0 then 1) and [PAD] [UNK] [CLS] [SEP] [MASK] as special tokens; tokenizer_config.json names them,
the class (PreTrainedTokenizerFast, which reads tokenizer.json), the longest input and the
inputs the model takes.

One difference stays, as transformers has it: the text "[MASK]" becomes the mask id there,
ordinary pieces in bertjax (`bertjax.tokenization.tokenizer`).
"""
from __future__ import annotations

import json
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

from bertjax import tokenization
from bertjax.tokenization import CLS, MASK, PAD, SEP, UNK, sentencepiece_proto

_WORD_START = "\u2581"  # "▁": sentencepiece's mark of a piece that begins a word
_SPECIAL = (PAD, UNK, CLS, SEP, MASK)


def files_for(tokenizer: tokenization.Tokenizer, architecture: str,
              max_length: int) -> dict[str, bytes]:
  """{file name: contents} of the Hugging Face tokenizer equal to `tokenizer`.

  Args:
    tokenizer: a model directory's tokenizer (`model_files.load_tokenizer`).
    architecture: "bert" (inputs: ids, token types, mask) or "modernbert" (ids, mask).
    max_length: the model's position table (tokenizer_config.json's model_max_length).
  """
  files = {}
  if isinstance(tokenizer, tokenization.SentencePieceTokenizer):
    hf = _with_bert_specials(_from_sentencepiece(tokenizer), tokenizer)
    files[tokenization.MODEL_FILE] = tokenizer.model_proto
  elif isinstance(tokenizer, tokenization.WordPieceTokenizer):
    hf = _with_bert_specials(tokenizer.pipeline(), tokenizer)  # WordPiece's own pipeline
    files[tokenization.VOCAB_FILE] = "".join(
        tokenizer.id_to_token(i) + "\n" for i in range(tokenizer.vocab_size)).encode("utf-8")
  elif isinstance(tokenizer, tokenization.ByteLevelBPETokenizer):
    hf = None  # the file as it is
    files[tokenization.HF_TOKENIZER_FILE] = tokenizer.file_contents
  else:
    raise TypeError(f"no Hugging Face form for {type(tokenizer).__name__}")
  if hf is not None:
    files[tokenization.HF_TOKENIZER_FILE] = hf.to_str(pretty=True).encode("utf-8")
  special = dict(cls_token=CLS, sep_token=SEP, mask_token=MASK, pad_token=PAD, unk_token=UNK)
  config: dict[str, Any] = {
      "tokenizer_class": "PreTrainedTokenizerFast", **special,
      "model_max_length": max_length, "clean_up_tokenization_spaces": False,
      "model_input_names": (["input_ids", "attention_mask"] if architecture == "modernbert"
                            else ["input_ids", "token_type_ids", "attention_mask"])}
  if isinstance(tokenizer, tokenization.WordPieceTokenizer):
    config["do_lower_case"] = tokenizer.lowercase
    config["max_input_chars_per_word"] = tokenizer.max_input_chars_per_word
  files[tokenization.CONFIG_FILE] = _json(config)
  files["special_tokens_map.json"] = _json(special)
  if isinstance(tokenizer, tokenization.ByteLevelBPETokenizer):
    files.update(tokenizer.companions)  # Hugging Face's own, where the model came from there
  return files


def _json(value: dict[str, Any]) -> bytes:
  return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def _from_sentencepiece(tokenizer: tokenization.SentencePieceTokenizer) -> HFTokenizer:
  """The pieces, normalizer and pre-tokenizer of a sentencepiece model as `tokenizers` has them."""
  proto = sentencepiece_proto.parse(tokenizer.model_proto)
  trainer, spec = proto.trainer_spec, proto.normalizer_spec
  byte_fallback = trainer.byte_fallback
  if trainer.model_type == sentencepiece_proto.UNIGRAM:
    model = models.Unigram([(p.piece, p.score) for p in proto.pieces], trainer.unk_id,
                           byte_fallback)
  elif trainer.model_type == sentencepiece_proto.BPE:
    vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
    model = models.BPE(vocab, _bpe_merges(proto), unk_token=proto.pieces[trainer.unk_id].piece,
                       fuse_unk=True, byte_fallback=byte_fallback)
  else:
    raise TypeError(f"sentencepiece model type {trainer.model_type} has no tokenizers twin")
  hf = HFTokenizer(model)
  steps = [normalizers.Precompiled(spec.precompiled_charsmap)] if spec.precompiled_charsmap else []
  if spec.remove_extra_whitespaces:
    steps += [normalizers.Replace(Regex(" {2,}"), " "), normalizers.Strip(left=True, right=True)]
  hf.normalizer = normalizers.Sequence(steps)
  prepend = "always" if spec.add_dummy_prefix else "never"
  hf.pre_tokenizer = pre_tokenizers.Metaspace(_WORD_START, prepend_scheme=prepend,
                                              split=trainer.split_by_whitespace)
  metaspace = decoders.Metaspace(_WORD_START, prepend_scheme=prepend)
  hf.decoder = (decoders.Sequence([decoders.ByteFallback(), decoders.Fuse(), metaspace])
                if byte_fallback else metaspace)
  return hf


def _bpe_merges(proto) -> list[tuple[str, str]]:
  """The merges a sentencepiece BPE model's pieces imply: each piece that two others make, the
  pieces by score (sentencepiece merges the best-scored pair first), a piece's splits by the
  ids of their halves."""
  ids = {p.piece: i for i, p in enumerate(proto.pieces)}
  merges = []
  for i, p in enumerate(proto.pieces):
    splits = [(p.piece[:k], p.piece[k:]) for k in range(1, len(p.piece))
              if p.piece[:k] in ids and p.piece[k:] in ids]
    merges += [(-p.score, i, ids[a], ids[b], a, b) for a, b in splits]
  return [(a, b) for *_, a, b in sorted(merges)]


def _with_bert_specials(hf: HFTokenizer, tokenizer: tokenization.Tokenizer) -> HFTokenizer:
  """`hf` with BERT's special tokens (at `tokenizer`'s ids) and its [CLS] A [SEP] B [SEP]."""
  hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in _SPECIAL])
  hf.post_processor = processors.TemplateProcessing(
      single=f"{CLS}:0 $A:0 {SEP}:0", pair=f"{CLS}:0 $A:0 {SEP}:0 $B:1 {SEP}:1",
      special_tokens=[(CLS, tokenizer.cls_id), (SEP, tokenizer.sep_id)])
  return hf
