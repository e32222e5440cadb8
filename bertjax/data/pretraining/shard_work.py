"""One text shard's work: its text -> tokenized documents, NSP pairs, spans, masks, in shards.

`process_text_shard` is the unit of work of a preparation (preparation.py runs it in local
processes, beam.py on Beam workers): it reads DATA/plan.json and the vocabulary, and writes what
text shard INDEX of the input becomes (layout.py names the files):

* its documents, split into training and held-out ones (a seeded `eval_fraction` of each
  shard's documents, at least 2 when it has 3 or more), tokenized: documents/{train,heldout};
* for each length, NSP pairs by google-research/bert's create_pretraining_data rules
  (pairs.py), `dupe_factor` passes for training and one for the held-out documents, a random
  next segment drawn from the same text shard as the original draws it from the same input
  file: seq{L}/{train,heldout}; with static masks, masked too (masking.py);
* for each length, the plan that packs its training pairs into rows (packing.py):
  seq{L}/packs-train (held-out pairs stay unpacked);
* with `contiguous`, for each length also the contiguous spans of the No NSP and LTR
  ablations (pairs.iter_contiguous_spans): contiguous{L}/{train,heldout};
* last, DATA/done/INDEX.json with its counts, which marks the shard finished.

Every random choice is drawn from a generator seeded by the flags' seed, the kind of choice and
the text shard, so the files depend on the flags only, not on the workers or the runner.
"""
from __future__ import annotations

import itertools
import json
import os

import numpy as np

from bertjax import tokenization
from bertjax.data.pretraining import layout, masking, packing, pairs, shards, text_shards

# Kinds of seeded generator (text_shards.HELDOUT_SEED is 1).
_PAIRS, _MASKS, _SPAN_MASKS, _SPAN_CUTS = 2, 3, 4, 5
_MASK_CHUNK = 4096  # pairs masked at a time


def process_text_shard(output_dir: str, index: int) -> dict:
  """Turns text shard `index` of DATA/plan.json into its document and pair shards, and writes
  DATA/done/INDEX.json with its counts (returned). Needs only DATA (Beam workers call it)."""
  with open(os.path.join(output_dir, layout.PLAN_FILE)) as f:
    plan = json.load(f)
  options, specs = layout.Options.from_json(plan["flags"]), plan["text_shards"]
  count = len(specs)
  tok = tokenization.load_tokenizer(os.path.join(output_dir, plan["vocab_file"]))
  dtype = shards.token_dtype(tok.vocab_size)
  splits, long_lines = shard_documents(options, specs, index, tok)
  documents = splits["train"] + splits["heldout"]
  done = {"long_lines_skipped": long_lines,"text_bytes": specs[index]["stop"] - specs[index]["start"]
          if "path" in specs[index] else 0,
          "documents": len(splits["train"]), "heldout_documents": len(splits["heldout"]),
          "sentences": sum(len(d) for d in documents),
          "tokens": int(sum(len(s) for d in documents for s in d)), "files": {},
          "packs": {}}
  for split, docs in splits.items():
    if not docs:
      continue
    name = shards.shard_name(layout.DOCUMENTS, split, index, count)
    done["files"][name] = shards.write_shard(
        os.path.join(output_dir, name), (shards.encode_document(d, dtype) for d in docs))
    for phase, length in enumerate(options.max_seq_length):
      name = shards.shard_name(layout.pairs_dir(length), split, index, count)
      lengths: list[int] = []  # [pairs] of the padded row each pair needs
      done["files"][name] = shards.write_shard(
          os.path.join(output_dir, name),
          _tapped(_pair_records(docs, split, index, phase, options, tok, dtype), lengths, dtype))
      if split == "train":
        packs = packing.plan_packs(np.array(lengths, np.int64), length,
                                   options.max_sequences_per_row)
        packing.write_plan(os.path.join(output_dir, packing.plan_name(name)), packs)
        done["packs"][packing.plan_name(name)] = [len(packs), int(sum(lengths))]
      if options.contiguous:
        name = shards.shard_name(layout.spans_dir(length), split, index, count)
        done["files"][name] = shards.write_shard(
            os.path.join(output_dir, name),
            _span_records(docs, split, index, phase, options, tok, dtype))
  counts = np.bincount(np.concatenate([s for d in splits["train"] for s in d] or [[]]).astype(
      np.int64), minlength=tok.vocab_size)
  done["token_counts"] = {int(i): int(c) for i, c in enumerate(counts) if c}
  layout.write_json(layout.done_path(output_dir, index), done)
  return done


def _tapped(records, lengths: list[int], dtype: np.dtype):
  """`records` (pair records) as they are, appending each one's row length to `lengths`."""
  for record in records:
    lengths.append(packing.pair_length(record, dtype))
    yield record


def shard_documents(options: layout.Options, specs: list[dict], index: int,
                    tok) -> tuple[dict[str, list[list[list[int]]]], int]:
  """({"train", "heldout"}: the tokenized documents of text shard `index`, each set shuffled as
  the original shuffles its documents; the number of lines skipped). A line over
  sentencepiece's limit (tokenization.MAX_SENTENCE_BYTES: a paragraph, document or file on one
  line, not a sentence) is skipped here as the vocabulary's training skips it."""
  rng = np.random.default_rng([options.seed, _PAIRS, index])
  texts = text_shards.read_text_shard(specs[index], options)
  kept = [[s for s in doc if not tokenization.too_long(s)] for doc in texts]
  long_lines = sum(map(len, texts)) - sum(map(len, kept))
  texts = kept
  held_out = text_shards.split_heldout(texts, options.eval_fraction, options.seed, index)
  splits = {}
  for split, docs in zip(("train", "heldout"), held_out):
    splits[split] = _tokenize(tok, [docs[i] for i in rng.permutation(len(docs))])
  return splits, long_lines


def _pair_records(docs, split: str, index: int, phase: int, options: layout.Options, tok, dtype):
  """The records of the NSP pairs (masked if static) of a text shard's `split` documents at the
  phase's length: dupe_factor passes for training, one for held-out documents."""
  length = options.max_seq_length[phase]
  rng = np.random.default_rng([options.seed, _PAIRS, index, phase, split == "heldout"])
  rows = pairs.iter_segment_pairs(docs, length, options.short_seq_prob, rng,
                                  options.dupe_factor if split == "train" else 1)
  return _records(rows, phase, options, tok, dtype, [options.seed, _MASKS, index, phase,
                                                     split == "train"])


def _span_records(docs, split: str, index: int, phase: int, options: layout.Options, tok, dtype):
  """The records of the contiguous spans (masked if static) of a text shard's `split`
  documents at the phase's length, each cut into A and B (pairs.iter_contiguous_spans);
  dupe_factor passes for training, one for held-out documents."""
  length = options.max_seq_length[phase]
  rng = np.random.default_rng([options.seed, _SPAN_CUTS, index, phase, split == "heldout"])
  rows = pairs.iter_contiguous_spans(docs, length, rng,
                                     options.dupe_factor if split == "train" else 1)
  return _records(rows, phase, options, tok, dtype, [options.seed, _SPAN_MASKS, index, phase,
                                                     split == "train"])


def _records(rows, phase: int, options: layout.Options, tok, dtype, mask_seed: list):
  """(A, B, is_random_next) rows as pair records; with static masks, masked by a generator
  seeded by `mask_seed`."""
  if not options.static_masks:
    return (shards.encode_pair(a, b, r, dtype) for a, b, r in rows)
  return _masked_records(
      rows, options.max_seq_length[phase], options.max_predictions_per_seq[phase],
      masking.SpecialTokens.from_tokenizer(tok), options, np.random.default_rng(mask_seed),
      tok.word_boundary_tables() if options.whole_word_masking else None, dtype)


def _tokenize(tok, texts: list[list[str]]) -> list[list[list[int]]]:
  """Documents of sentences -> documents of token-id lists (empty sentences dropped)."""
  flat = tok.encode_batch([s for doc in texts for s in doc])
  documents, start = [], 0
  for doc in texts:
    sentences = [s for s in flat[start:start + len(doc)] if s]
    start += len(doc)
    if sentences:
      documents.append(sentences)
  return documents


def _masked_records(rows, length, predictions, special, options, rng, word_tables, dtype):
  """Static masks: (A, B, is_random_next) rows masked `_MASK_CHUNK` at a time, as records with
  their masks."""
  rows = iter(rows)
  while chunk := list(itertools.islice(rows, _MASK_CHUNK)):
    padded = pairs.pad_pairs(chunk, length, special)
    ids = padded["input_ids"]
    starts = None if word_tables is None else tokenization.word_starts(ids, *word_tables)
    masked = masking.mask_batch(ids, padded["input_mask"], rng, special, options.masked_lm_prob,
                                predictions, starts)
    for row, (a, b, is_random) in enumerate(chunk):
      tokens = masked["input_ids"][row]
      real = int(masked["masked_lm_weights"][row].sum())
      yield shards.encode_pair(tokens[1:1 + len(a)], tokens[2 + len(a):2 + len(a) + len(b)],
                               is_random, dtype, masked["masked_lm_positions"][row, :real],
                               masked["masked_lm_ids"][row, :real])
