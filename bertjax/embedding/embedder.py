"""Sentence embeddings from a BERT or ModernBERT: `Embedder.load(DIR).encode(texts) -> array`.

DIR is one of:
  - a sentence-transformers directory (modules.json): its encoder, pooling, Dense layers,
    normalisation, length, lower-casing and prompts (`bertjax.embedding.st_files`);
  - a Hugging Face BERT or ModernBERT directory (config.json, weights, tokenizer), or a bertjax
    model directory or workdir (bert_config.json); these say nothing of pooling, so `pooling`
    is required.
Texts are tokenized as the directory's own tokenizer does (a Hugging Face tokenizer.json through
`tokenizers`, exactly as sentence-transformers does, in a Hugging Face or sentence-transformers
directory; else bertjax's tokenizer with [CLS] and [SEP]), cut to max_seq_length tokens. They are packed several to a row (each attending only to itself,
positions restarting at each text: `bertjax.data.packed_rows`' layout), texts up to 128 tokens
in rows of 128 and longer ones in rows of the longest, so that little compute goes to padding
and at most two programs are compiled for the whole input; each batch of rows is split over every local device
(`jax.devices()`, the parameters replicated), and the embeddings returned in input order,
float32.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bertjax.convert import hf, hf_files
from bertjax.embedding import pooling, st_files
from bertjax.errors import UserError
from bertjax.modeldir import model_files, model_options, saved_params
from bertjax.models import heads
from bertjax.models.config import BertConfig

_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "identity": lambda x: x, "tanh": jnp.tanh, "relu": jax.nn.relu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False), "sigmoid": jax.nn.sigmoid}
_SHORTEST_ROW = 128  # tokens a packed row holds at least (more where a text is longer)
_TOKENS_A_TEXT = 64  # a batch of batch_size texts is batch_size * 64 tokens of rows


@dataclasses.dataclass(frozen=True)
class _Tokenizer:
  """Text -> token ids with the special tokens, cut to max_seq_length; and which ids are
  special (a prompt's trailing [SEP] is not part of it)."""
  encode: Callable[[str], list[int]]
  special_ids: frozenset[int]
  vocab_size: int


def _hf_tokenizer(directory: str, max_seq_length: int, lower_case: bool) -> _Tokenizer:
  """DIR/tokenizer.json through `tokenizers`, as sentence-transformers runs it: truncated to
  max_seq_length with the special tokens, lower-cased first where asked and not done already."""
  from tokenizers import Tokenizer, normalizers  # pylint: disable=import-outside-toplevel
  path = os.path.join(directory, "tokenizer.json")
  try:
    tok = Tokenizer.from_file(path)
  except Exception as e:  # tokenizers raises a bare Exception for a bad file
    raise UserError(f"{path} is not a tokenizer tokenizers can read ({e}).") from None
  if lower_case:
    spec = json.loads(tok.to_str()).get("normalizer") or {}
    parts = spec.get("normalizers", [spec])
    if not any(p.get("type") == "Lowercase" or p.get("lowercase") for p in parts if p):
      tok.normalizer = normalizers.Sequence(
          [normalizers.Lowercase()] + ([tok.normalizer] if tok.normalizer else []))
  tok.no_padding()
  tok.enable_truncation(max_length=max_seq_length)
  special = frozenset(i for i, added in tok.get_added_tokens_decoder().items() if added.special)
  return _Tokenizer(lambda text: tok.encode(text).ids, special, tok.get_vocab_size())


def _bertjax_tokenizer(directory: str, max_seq_length: int) -> _Tokenizer:
  """bertjax's tokenizer of a model directory: [CLS] pieces [SEP], cut to max_seq_length."""
  tok = model_files.load_tokenizer(directory)
  return _Tokenizer(lambda text: [tok.cls_id, *tok.encode(text)[:max_seq_length - 2],
                                  tok.sep_id], frozenset((tok.cls_id, tok.sep_id)),
                    tok.vocab_size)


def _encoder_params(directory: str) -> tuple[dict[str, Any], BertConfig, str]:
  """(encoder parameters, BertConfig, the directory its tokenizer is in) of a Hugging Face or
  bertjax model directory."""
  if os.path.isfile(os.path.join(directory, "config.json")) and not os.path.isfile(
      os.path.join(directory, model_files.BERT_CONFIG_FILE)):
    hf_config = hf_files.load_hf_config(directory)
    config = hf_files.hf_config_to_bert_config(hf_config)
    task, num_labels = hf_files.hf_task(hf_config)
    params, report = hf.from_hf(hf_files.load_hf_state_dict(directory), config, task, num_labels)
    missing = report.missing
    params = params["bert"]
  else:
    model_dir = model_files.find_model_dir(directory)
    config = model_files.load_bert_config(model_dir)
    encoder = heads.make_encoder(config, use_pooler=False)
    ids = jnp.zeros((1, 2), jnp.int32)
    target = jax.eval_shape(lambda: nn.unbox(encoder.init(jax.random.key(0), ids, ids, ids,
                                                          deterministic=True))["params"])
    target = {"bert": jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), target)}
    loaded, report = saved_params.load_params(directory, target, vocab_size=config.vocab_size)
    missing, params, directory = report.missing, loaded["bert"], model_dir
  lacking = [p for p in missing if p.startswith("bert/") and not
             p.startswith(("bert/pooler/", "bert/head/"))]
  if lacking:
    raise UserError(f"{directory} lacks encoder parameters ({', '.join(lacking[:4])} ...); give "
                    "a BERT or ModernBERT model directory.")
  return params, config, directory


def pooling_modes(text: str | None) -> tuple[str, ...]:
  """Comma-separated pooling modes ("mean,max", a --pooling flag or config field) as a tuple;
  () for none."""
  return tuple(m.strip() for m in (text or "").split(",") if m.strip())


def check_flags(pooling: str | None, normalize: bool) -> None:
  """UserError for --normalize without --pooling (a sentence-transformers model says itself
  whether it normalizes)."""
  if normalize and not pooling:
    raise UserError("--normalize goes with --pooling; a sentence-transformers model says "
                    "itself whether it normalizes.")


@dataclasses.dataclass(frozen=True)
class Embedder:
  """A model that embeds texts (module docstring); build it with `Embedder.load`."""
  config: BertConfig
  weights: dict[str, Any]  # {"encoder": parameters, "dense": [(weight [out, in], bias)]}
  recipe: st_files.Recipe
  tokenizer: _Tokenizer
  max_seq_length: int
  mesh: Mesh

  @classmethod
  def load(cls, path: str, *, pooling_modes: Sequence[str] = (), normalize: bool = False,
           max_seq_length: int = 0) -> "Embedder":
    """The embedder of DIR `path` (module docstring). `pooling_modes` (required for a directory
    that is not sentence-transformers', refused for one that is) and `normalize` say what a
    plain model directory computes after its encoder; `max_seq_length` (0: the directory's)
    cuts texts shorter."""
    if not os.path.isdir(path):
      raise UserError(f"--model={path} is not a directory; give a sentence-transformers, Hugging "
                      "Face or bertjax model directory.")
    if st_files.is_sentence_transformers_dir(path):
      if pooling_modes:
        raise UserError(f"{path} is a sentence-transformers model with its own pooling; leave "
                        "--pooling out.")
      recipe = st_files.read_recipe(path)
    elif not pooling_modes:
      raise UserError(f"{path} is not a sentence-transformers model (no modules.json), so it "
                      "says nothing of pooling; give --pooling (mean, cls, max, "
                      "mean_sqrt_len_tokens, weightedmean or lasttoken).")
    else:
      bad = [m for m in pooling_modes if m not in st_files.POOLING_MODES]
      if bad:
        raise UserError(f"--pooling={bad[0]}; use {', '.join(st_files.POOLING_MODES)}.")
      # In sentence-transformers' order (cls, max, mean, ...), the one its Pooling concatenates
      # in, so that an export (`st_export`) embeds as this does.
      recipe = st_files.Recipe(transformer_dir=path, normalize=normalize, pooling=tuple(
          m for m in st_files.POOLING_MODES if m in pooling_modes))
    params, config, tokenizer_dir = _encoder_params(recipe.transformer_dir)
    # Inference: no dropout, so the fastest attention path the backend has (`attention.attend`).
    config = dataclasses.replace(config, dropout_rate=0.0, attention_dropout_rate=0.0,
                                 attention="auto")
    length = min(max_seq_length or recipe.max_seq_length or config.max_position_embeddings,
                 config.max_position_embeddings)
    if length < 2:
      raise UserError(f"max_seq_length={length}; give at least 2 ([CLS] and [SEP]).")
    # A Hugging Face tokenizer.json is read as sentence-transformers reads it: in a Hugging Face
    # directory, and in a sentence-transformers one (a contrastive run's workdir carries its
    # starting model's); a bertjax model directory's tokenizer is bertjax's.
    hf_tokenizer = os.path.isfile(os.path.join(tokenizer_dir, "tokenizer.json")) and (
        st_files.is_sentence_transformers_dir(path) or
        not os.path.isfile(os.path.join(tokenizer_dir, model_files.BERT_CONFIG_FILE)))
    tokenizer = (_hf_tokenizer(tokenizer_dir, length, recipe.do_lower_case) if hf_tokenizer
                 else _bertjax_tokenizer(tokenizer_dir, length))
    model_options.check_vocabulary(config, tokenizer.vocab_size, tokenizer_dir)
    _check_dense(recipe, config)
    mesh = Mesh(np.asarray(jax.devices()), ("data",))
    replicated = NamedSharding(mesh, PartitionSpec())
    weights = jax.device_put({"encoder": params, "dense": [(d.weight, d.bias)
                                                           for d in recipe.dense]}, replicated)
    return cls(config, weights, recipe, tokenizer, length, mesh)

  @classmethod
  def from_flags(cls, path: str, pooling: str | None, normalize: bool,
                 max_seq_length: int = 0) -> "Embedder":
    """`load` as the commands' --model, --pooling, --normalize and --max_seq_length flags give
    it (`bertjax.embed`, `bertjax.embedding.evaluate`); UserError for flags that do not go
    together (`check_flags`)."""
    check_flags(pooling, normalize)
    return cls.load(path, pooling_modes=pooling_modes(pooling), normalize=normalize,
                    max_seq_length=max_seq_length)

  @property
  def _head(self) -> tuple[tuple[str, ...], tuple[str, ...], bool]:
    """What follows the encoder, hashable: (pooling modes, Dense activations, normalize)."""
    return (self.recipe.pooling, tuple(d.activation for d in self.recipe.dense),
            self.recipe.normalize)

  @property
  def dimension(self) -> int:
    """The size of an embedding."""
    if self.recipe.dense:
      return self.recipe.dense[-1].weight.shape[0]
    return self.config.hidden_size * len(self.recipe.pooling)

  def prompt_text(self, prompt: str | None = None, prompt_name: str | None = None) -> str:
    """The prompt prepended to each text: `prompt`, the recipe's prompt named `prompt_name`, or
    its default one ("" for none)."""
    if prompt is not None and prompt_name is not None:
      raise UserError("give --prompt or --prompt_name, not both.")
    if prompt is not None:
      return prompt
    name = prompt_name if prompt_name is not None else self.recipe.default_prompt_name
    if name is None:
      return ""
    if name not in self.recipe.prompts:
      known = ", ".join(self.recipe.prompts) or "none"
      raise UserError(f"--prompt_name={name}: the model's prompts are {known}.")
    return self.recipe.prompts[name]

  def encode(self, texts: Sequence[str], *, batch_size: int = 32, prompt: str | None = None,
             prompt_name: str | None = None, progress: bool = False,
             dtype: Any = np.float32) -> np.ndarray:
    """[len(texts), dimension] embeddings of `texts`, in their order (module docstring), with
    the prompt (`prompt_text`) prepended to each."""
    empty = [i for i, text in enumerate(texts) if not text.strip()]
    if empty:
      raise UserError(f"text {empty[0] + 1} (of {len(texts)}) is empty; give every text some "
                      f"words ({len(empty)} empty in all).")
    if batch_size < 1:
      raise UserError(f"batch_size={batch_size}; use 1 or more.")
    text = self.prompt_text(prompt, prompt_name)
    prompt_length = 0
    if text and not self.recipe.include_prompt:
      ids = self.tokenizer.encode(text)
      prompt_length = len(ids) - (1 if ids and ids[-1] in self.tokenizer.special_ids else 0)
    encoded = [self.tokenizer.encode(text + t) for t in texts]
    lengths = np.asarray([len(ids) for ids in encoded])
    # Two row lengths at most (two compiled programs): texts up to 128 tokens in rows of 128,
    # longer ones in rows of the longest (a row's attention grows with its length).
    short = min(self.max_seq_length, _SHORTEST_ROW)
    groups = []  # (row length, plan of text indices)
    for chosen in (lengths <= short, lengths > short):
      indices = np.flatnonzero(chosen)
      if len(indices):
        row = min(self.max_seq_length, max(short, -(-int(lengths[indices].max()) // 16) * 16))
        groups.append((row, [[int(indices[j]) for j in members]
                             for members in _plan(lengths[indices], row, row // 2)]))
    devices = self.mesh.devices.size
    sharded = NamedSharding(self.mesh, PartitionSpec("data"))
    out = np.zeros((len(texts), self.dimension), dtype)
    work = []  # (row length, rows a batch, the batch's plan)
    for row, plan in groups:
      rows = -(-max(1, batch_size * _TOKENS_A_TEXT // row) // devices) * devices
      work += [(row, rows, plan[start:start + rows]) for start in range(0, len(plan), rows)]
    for row, rows, batch_plan in tqdm.tqdm(work, desc="embed", unit="batch",
                                          disable=not progress):
      batch, placed = _packed(batch_plan, encoded, rows, row)
      vectors = np.asarray(_embed(self.config, self._head, prompt_length, row // 2,
                                  self.weights,
                                  {k: jax.device_put(v, sharded) for k, v in batch.items()}))
      r, slot, i = (np.asarray(x) for x in zip(*placed))
      out[i] = vectors[r, slot].astype(dtype)
    return out


def _packed(plan: list[list[int]], encoded: list[list[int]], rows: int, row: int
            ) -> tuple[dict[str, np.ndarray], list[tuple[int, int, int]]]:
  """({input_ids, input_mask, position_ids, sequence_ids: [rows, row] int32}, [(row, slot,
  text)]) of the texts `plan` lays out, one list of text indices a row (`_plan`)."""
  batch = {k: np.zeros((rows, row), np.int32)
           for k in ("input_ids", "input_mask", "position_ids", "sequence_ids")}
  placed = []
  for r, members in enumerate(plan):
    offset = 0
    for slot, i in enumerate(members):
      n = len(encoded[i])
      batch["input_ids"][r, offset:offset + n] = encoded[i]
      batch["input_mask"][r, offset:offset + n] = 1
      batch["position_ids"][r, offset:offset + n] = np.arange(n)
      batch["sequence_ids"][r, offset:offset + n] = slot + 1
      placed.append((r, slot, i))
      offset += n
  return batch, placed


def _plan(lengths: np.ndarray, row: int, slots: int) -> list[list[int]]:
  """Texts (by index) packed into rows of `row` tokens and at most `slots` texts: the longest
  left first, then the shortest that still fit (one pass, from both ends of the sorted list)."""
  order = np.argsort(-lengths, kind="stable")
  plan, first, last = [], 0, len(order) - 1
  while first <= last:
    members, room = [int(order[first])], row - int(lengths[order[first]])
    first += 1
    while first <= last and len(members) < slots and lengths[order[last]] <= room:
      members.append(int(order[last]))
      room -= int(lengths[order[last]])
      last -= 1
    plan.append(members)
  return plan


def _check_dense(recipe: st_files.Recipe, config: BertConfig) -> None:
  """Each Dense module takes what the one before it gives (UserError if not)."""
  width = config.hidden_size * len(recipe.pooling)
  for i, dense in enumerate(recipe.dense):
    if dense.weight.shape[1] != width:
      raise UserError(f"Dense module {i + 1} takes {dense.weight.shape[1]} features, but the "
                      f"pooling before it gives {width}; the directory's modules do not fit.")
    width = dense.weight.shape[0]


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _embed(config: BertConfig, head: tuple[tuple[str, ...], tuple[str, ...], bool],
           prompt_length: int, slots: int, weights: dict[str, Any],
           batch: dict[str, jax.Array]) -> jax.Array:
  """[rows, slots, dimension] float32 embeddings of the texts of packed rows (`batch`: input_ids,
  input_mask, position_ids, sequence_ids [rows, seq]); `head` is `Embedder._head`."""
  modes, activations, normalize = head
  encoder = heads.make_encoder(config, use_pooler=False)
  out = encoder.apply({"params": weights["encoder"]}, batch["input_ids"], None,
                      batch["input_mask"], position_ids=batch["position_ids"],
                      sequence_ids=batch["sequence_ids"], deterministic=True)
  x = pooling.pool(out.sequence_output, batch["sequence_ids"], batch["position_ids"], modes,
                   slots, prompt_length)
  for (weight, bias), activation in zip(weights["dense"], activations):
    x = x @ weight.T + (0.0 if bias is None else bias)
    x = _ACTIVATIONS[activation](x)
  if normalize:
    x = x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
  return x
