"""Feature extraction: per-token vectors of chosen layers, as google-research/bert's
extract_features.py writes them.

  python -m bertjax.main --config=configs/features.py --workdir=DIR \
      --config.init_checkpoint=CKPT --config.input_file=FILE --config.layers=-1,-2,-3,-4

FILE has one input a line; "text_a ||| text_b" is a pair. CKPT is a bertjax checkpoint with its
bert_config.json and tokenizer beside it: a pretraining workdir (or one of its step
directories), or the output of `python -m bertjax.convert --from=hf`. DIR/features.jsonl gets one
JSON object a line:

  {"linex_index": i, "features": [{"token": "[CLS]", "layers": [{"index": -1, "values": [...]},
                                   ...]}, ...]}

Layer -1 is the last Transformer layer, 0 the first (the embedding output is not a layer, as in
the original). Values are rounded to 6 decimals, as the original does.
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax import run_config, tokenization
from bertjax.data import sources
from bertjax.data.finetuning.glue import truncated_lengths
from bertjax.errors import UserError
from bertjax.modeldir import model_files, model_options, saved_params
from bertjax.models import heads

OUTPUT_FILE = "features.jsonl"
PAIR_SEPARATOR = " ||| "


def read_inputs(path: str) -> list[tuple[str, str | None]]:
  """FILE -> [(text_a, text_b or None)], one per line (extract_features.py's format)."""
  if not os.path.isfile(path):
    raise UserError(f"input_file {path!r} does not exist; give a text file with one input a line "
                    "(\"text_a ||| text_b\" for pairs) as --config.input_file.")
  with open(path, "rb") as f:
    text = sources.decode_text(path, f.read())
  inputs = []
  for line in text.splitlines():
    line = line.strip()
    a, sep, b = line.partition("|||")
    inputs.append((a.strip(), b.strip()) if sep else (line, None))
  if not inputs:
    raise UserError(f"{path} is empty; give one input a line.")
  return inputs


def encode(tok: tokenization.Tokenizer, text_a: str, text_b: str | None,
           max_seq_length: int) -> tuple[list[int], list[int]]:
  """(ids, segment ids) of [CLS] A [SEP] (B [SEP]), the longer of A and B cut first."""
  a = tok.encode(text_a)
  b = tok.encode(text_b) if text_b is not None else None
  if b is None:
    a = a[:max_seq_length - 2]
    return [tok.cls_id] + a + [tok.sep_id], [0] * (len(a) + 2)
  len_a, len_b = truncated_lengths(len(a), len(b), max_seq_length - 3)
  a, b = a[:len_a], b[:len_b]
  ids = [tok.cls_id] + a + [tok.sep_id] + b + [tok.sep_id]
  return ids, [0] * (len(a) + 2) + [1] * (len(b) + 1)


def parse_layers(layers: str, num_layers: int) -> list[int]:
  """"-1,-2" -> [-1, -2], each checked against the model's layer count."""
  try:
    indices = [int(x) for x in str(layers).split(",") if x.strip()]
  except ValueError:
    raise UserError(f"layers={layers!r}; give comma-separated layer indices, e.g. "
                    "-1,-2,-3,-4.") from None
  bad = [i for i in indices if not -num_layers <= i < num_layers]
  if not indices or bad:
    raise UserError(f"layers={layers!r}: the model has {num_layers} layers, so indices lie in "
                    f"[{-num_layers}, {num_layers - 1}].")
  return indices


def _batches(encoded: list[tuple[list[int], list[int]]], batch_size: int,
             seq: int) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
  """(first example index, padded [batch_size, seq] int32 arrays) over the encoded inputs."""
  for start in range(0, len(encoded), batch_size):
    chunk = encoded[start:start + batch_size]
    arrays = {k: np.zeros((batch_size, seq), np.int32)
              for k in ("input_ids", "segment_ids", "input_mask")}
    for row, (ids, segments) in enumerate(chunk):
      arrays["input_ids"][row, :len(ids)] = ids
      arrays["segment_ids"][row, :len(ids)] = segments
      arrays["input_mask"][row, :len(ids)] = 1
    yield start, arrays


def run(config: run_config.FeaturesRun, workdir: str) -> str:
  """Writes WORKDIR/features.jsonl for config.input_file; returns its path."""
  if not config.init_checkpoint:
    raise UserError("feature extraction needs --config.init_checkpoint, a bertjax checkpoint "
                    "(a pretraining workdir or a converted model directory).")
  output = os.path.join(workdir, OUTPUT_FILE)
  if os.path.exists(output):
    raise UserError(f"{output} exists; give a new --workdir (nothing is overwritten).")
  inputs = read_inputs(config.input_file)
  model_dir = model_files.find_model_dir(config.init_checkpoint)
  bert_config = model_files.load_bert_config(model_dir)
  layers = parse_layers(config.layers, bert_config.num_layers)
  tok = model_files.load_tokenizer(model_dir)
  model_options.check_fits(bert_config, tok.vocab_size, [config.max_seq_length], model_dir,
                           length_field="max_seq_length")

  model = heads.BertForPreTraining(bert_config, next_sentence=not bert_config.is_modernbert)
  dummy = jnp.zeros((1, 2), jnp.int32)
  target = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.PRNGKey(0), dummy, dummy,
                                                      dummy, deterministic=True))["params"])
  target = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), target)
  params, report = saved_params.load_params(config.init_checkpoint, target,
                                          vocab_size=bert_config.vocab_size)
  lacking = [p for p in report.missing if p.startswith("bert/") and not
             p.startswith(("bert/pooler/", "bert/head/"))]
  if lacking:
    raise UserError(f"{report.step_dir} lacks encoder parameters ({', '.join(lacking[:4])} ...);"
                    " give a checkpoint of a BERT encoder.")
  encoder = heads.make_encoder(bert_config, use_pooler=False)

  @jax.jit
  def layer_outputs(encoder_params: Any, batch: dict[str, jax.Array]) -> jax.Array:
    out = encoder.apply({"params": encoder_params}, batch["input_ids"], batch["segment_ids"],
                        batch["input_mask"], deterministic=True, output_hidden_states=True)
    all_layers = jnp.stack(out.hidden_states[1:])  # [num_layers, batch, seq, hidden]
    return all_layers[jnp.asarray(layers)].astype(jnp.float32)  # [len(layers), batch, seq, H]

  encoded = [encode(tok, a, b, config.max_seq_length) for a, b in inputs]
  os.makedirs(workdir, exist_ok=True)
  partial = f"{output}.partial"
  with open(partial, "w", encoding="utf-8") as f:
    for start, batch in _batches(encoded, config.batch_size, config.max_seq_length):
      values = np.asarray(layer_outputs(params["bert"], batch))
      for row in range(min(config.batch_size, len(encoded) - start)):
        ids = encoded[start + row][0]
        features = [{"token": tok.id_to_token(token_id),
                     "layers": [{"index": index,
                                 "values": [round(float(x), 6) for x in values[k, row, position]]}
                                for k, index in enumerate(layers)]}
                    for position, token_id in enumerate(ids)]
        f.write(json.dumps({"linex_index": start + row, "features": features}) + "\n")
  os.replace(partial, output)
  print(f"features: {len(encoded)} inputs, layers {layers} -> {output}")
  return output
