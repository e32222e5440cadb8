"""Shared by the tests of bertjax.convert on ModernBERT (test_convert_modernbert_*.py).

Small random transformers ModernBERT models (float32, eager attention, eval mode): 4 layers, so
that global (0, 3) and local (1, 2) layers both appear, hidden 64, 4 heads, GeGLU width 96, a
vocabulary of 100 and a window of 8 tokens (4 a side), shorter than the batches' rows. Their
LayerNorm weights, decoder bias and classifier bias are randomised, so that a weight mapped to
the wrong place (or not at all) shows. `_convert` maps a model's state_dict through the
converter as `python -m bertjax.convert --from=hf` does.
"""
import numpy as np
import torch
import transformers

from bertjax.convert import hf, hf_files

VOCAB = 100
SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]  # ids 0..4 in the test vocabularies
UNK, CLS, SEP, PAD, MASK = range(5)
NUM_LABELS = 3
HF_CLASSES = {name: getattr(transformers, name) for name in (
    "ModernBertModel", "ModernBertForMaskedLM", "ModernBertForSequenceClassification",
    "ModernBertForTokenClassification", "ModernBertForQuestionAnswering",
    "ModernBertForMultipleChoice")}


def hf_config(**overrides) -> transformers.ModernBertConfig:
  fields = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                intermediate_size=96, local_attention=8, max_position_embeddings=128,
                global_attn_every_n_layers=3, pad_token_id=PAD, bos_token_id=CLS,
                eos_token_id=SEP, cls_token_id=CLS, sep_token_id=SEP, num_labels=NUM_LABELS,
                attn_implementation="eager")
  return transformers.ModernBertConfig(**{**fields, **overrides})


def hf_model(name: str, seed: int = 0, **overrides):
  """A seeded random transformers ModernBERT class `name`, eval mode, its norms and biases
  randomised."""
  torch.manual_seed(seed)
  model = HF_CLASSES[name](hf_config(**overrides)).eval()
  with torch.no_grad():
    for param_name, param in model.named_parameters():
      if "norm" in param_name or param_name.endswith("bias"):
        param.add_(torch.randn_like(param) * 0.2)
  return model


def state_dict(model) -> dict[str, np.ndarray]:
  """The tensors save_pretrained writes (the tied decoder weight left out)."""
  return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()
          if k != "decoder.weight"}


def convert(model):
  """(bertjax params, BertConfig, report) of a transformers ModernBERT model."""
  hf_dict = model.config.to_dict()
  config = hf_files.hf_config_to_bert_config(hf_dict)
  task, labels = hf_files.hf_task({**hf_dict, "architectures": [type(model).__name__]})
  params, report = hf.from_hf(state_dict(model), config, task, labels)
  return params, config, report


def padded_batch(rows: int = 3, seq: int = 32, seed: int = 0,
                 lengths=(32, 27, 13)) -> tuple[np.ndarray, np.ndarray]:
  """[rows, seq] ids ([CLS] first, random pieces, [SEP] last, then [PAD]) and the mask."""
  rng = np.random.RandomState(seed)
  ids = rng.randint(5, VOCAB, (rows, seq))
  mask = (np.arange(seq)[None, :] < np.asarray(lengths)[:rows, None]).astype(np.int64)
  ids[:, 0] = CLS
  ids[np.arange(rows), np.asarray(lengths)[:rows] - 1] = SEP
  return np.where(mask == 1, ids, PAD), mask


def max_diff(ours, theirs) -> tuple[float, float]:
  """(largest absolute difference, largest magnitude of `theirs`)."""
  ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
  assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
  return float(np.abs(ours - theirs).max()), float(np.abs(theirs).max())


def assert_close(ours, theirs, what: str, tol: float = 1e-5) -> float:
  """Within tol * max(1, scale) of transformers; returns the difference (printed for -s)."""
  diff, scale = max_diff(ours, theirs)
  print(f"{what}: max |diff| {diff:.2e} (scale {scale:.2f})")
  assert diff <= tol * max(1.0, scale), (what, diff, scale)
  return diff
