"""What every fine-tuning task does alike: the pretrained model it starts from, the batches of
its features, and a run measured in epochs.

A fine-tuning config has `init_checkpoint` (required), `model.{dropout_rate,
attention_dropout_rate, dtype}`, `data.max_seq_length` and `train.{batch_size, eval_batch_size,
num_train_epochs, warmup_proportion, eval_every_steps, checkpoint_every_steps}` (configs/glue.py).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import jax
import ml_collections
import numpy as np

from bertjax import model_files, tokenization
from bertjax.data.pipeline import FeatureBatches
from bertjax.errors import UserError
from bertjax.models.bert import BertConfig


@dataclasses.dataclass(frozen=True)
class Pretrained:
  """The model a fine-tuning run starts from.

  Attributes:
    model_dir: the directory of init_checkpoint's bert_config.json and tokenizer.
    bert_config: its BertConfig with this run's dropout and compute dtype.
    tokenizer: its tokenizer.
    files: bert_config.json and the tokenizer files, for the run's workdir (`train.Task.files`),
      so that a fine-tuned workdir is itself a model directory.
  """
  model_dir: str
  bert_config: BertConfig
  tokenizer: tokenization.Tokenizer
  files: Mapping[str, str | bytes]


def load_pretrained(config: ml_collections.ConfigDict, what: str) -> Pretrained:
  """The pretrained model of `config.init_checkpoint`, checked against the config.

  Args:
    config: a fine-tuning config.
    what: the task in words, for the errors (e.g. "GLUE fine-tuning").
  Raises:
    UserError: no init_checkpoint, no model directory there, sequences longer than its
      positions, or a tokenizer that does not fit its vocabulary.
  """
  if not config.init_checkpoint:
    raise UserError(f"{what} starts from a pretrained model: set --config.init_checkpoint to a "
                    "pretraining workdir or a directory from `python -m bertjax.convert "
                    "--from=hf|tf`.")
  model_dir = model_files.find_model_dir(config.init_checkpoint)
  bert_config = dataclasses.replace(
      model_files.load_bert_config(model_dir), dropout_rate=config.model.dropout_rate,
      attention_dropout_rate=config.model.attention_dropout_rate, dtype=config.model.dtype)
  if config.data.max_seq_length > bert_config.max_position_embeddings:
    raise UserError(f"data.max_seq_length={config.data.max_seq_length} exceeds the model's "
                    f"{bert_config.max_position_embeddings} positions; lower it.")
  tokenizer = model_files.load_tokenizer(model_dir)
  if tokenizer.vocab_size > bert_config.vocab_size:
    raise UserError(f"the tokenizer in {model_dir} has {tokenizer.vocab_size} ids but the model "
                    f"{bert_config.vocab_size}; they do not belong together.")
  files = {model_files.BERT_CONFIG_FILE: model_files.bert_config_json(bert_config),
           **model_files.tokenizer_file_contents(model_dir)}
  return Pretrained(model_dir, bert_config, tokenizer, files)


def check_batch_sizes(config: ml_collections.ConfigDict) -> None:
  """The global batch sizes must split evenly over the hosts (UserError if not)."""
  tr, hosts = config.train, jax.process_count()
  if tr.batch_size % hosts or tr.eval_batch_size % hosts:
    raise UserError(f"train.batch_size={tr.batch_size} and train.eval_batch_size="
                    f"{tr.eval_batch_size} must divide over {hosts} hosts.")


def feature_batches(config: ml_collections.ConfigDict, features: Mapping[str, np.ndarray], *,
                    training: bool) -> FeatureBatches:
  """This host's batches of `features`: train.batch_size, shuffled, for training; else
  train.eval_batch_size in order (for evaluation and prediction)."""
  size = config.train.batch_size if training else config.train.eval_batch_size
  return FeatureBatches(features, batch_size=size // jax.process_count(), seed=config.seed,
                        process_index=jax.process_index(), process_count=jax.process_count(),
                        shuffle=training)


def set_schedule(config: ml_collections.ConfigDict, steps_per_epoch: int) -> None:
  """Sets train.num_train_steps from num_train_epochs, warmup_steps from warmup_proportion, and
  eval/checkpoint intervals left at -1 to one epoch (the written config.json shows them)."""
  tr = config.train
  with config.unlocked():
    tr.num_train_steps = max(1, math.ceil(tr.num_train_epochs * steps_per_epoch))
    tr.warmup_steps = int(tr.warmup_proportion * tr.num_train_steps)
    if tr.eval_every_steps < 1:
      tr.eval_every_steps = steps_per_epoch
    if tr.checkpoint_every_steps < 1:
      tr.checkpoint_every_steps = steps_per_epoch
