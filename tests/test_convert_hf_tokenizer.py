"""`convert --to=hf` writes a tokenizer that transformers' AutoTokenizer loads as it is and that
gives bertjax's ids on real text, for every kind of tokenizer a bertjax model directory holds
(sentencepiece unigram or BPE, WordPiece cased or uncased, byte-level BPE); the exported model
gives bertjax's logits on those ids.

The text is the bundled corpus's last 300 sentences (the tokenizers learn from its first
chapters), a few pairs, and text that tests the normalizers: runs of spaces, tabs and line
breaks, accents, full-width letters, an empty string.
"""
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, normalizers, pre_tokenizers, trainers

from bertjax import tokenization
from bertjax.convert import hf
from bertjax.convert import __main__ as cli
from bertjax.data import sources
from bertjax.models import heads
from bertjax.models.config import BertConfig, bert_config
from bertjax.modeldir import model_files

from bpe_helpers import write_modernbert_like_tokenizer

DOCUMENTS = sources.read_text_files(sources.BUNDLED_CORPUS)
TRAINING = [s for doc in DOCUMENTS[:40] for s in doc]
HELD_OUT = [s for doc in DOCUMENTS for s in doc][-300:]
ODD = ["  Hello   world  ", "caf\u00e9 na\u00efve \uff21\uff22\uff23 \u00c9L\u00c8VE", "tab\there\nnew line",
       "", " x", "Don't -- stop!!", "\u4e2d\u6587 and 12,345.67"]
PAIRS = [(HELD_OUT[i], HELD_OUT[i + 1]) for i in range(0, 20, 2)]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _wordpiece_vocab(directory, lowercase):
  """vocab.txt of a WordPiece vocabulary learned from TRAINING (specials first)."""
  tok = HFTokenizer(models.WordPiece(unk_token="[UNK]"))
  tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.train_from_iterator(TRAINING, trainers.WordPieceTrainer(
      vocab_size=900, special_tokens=SPECIALS, show_progress=False))
  vocab = sorted(tok.get_vocab().items(), key=lambda item: item[1])
  path = os.path.join(directory, "vocab.txt")
  with open(path, "w", encoding="utf-8") as f:
    f.write("".join(piece + "\n" for piece, _ in vocab))
  with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
    f.write('{"do_lower_case": %s}\n' % str(lowercase).lower())
  return [path, os.path.join(directory, "tokenizer_config.json")]


def _tokenizer_files(kind, directory):
  """The tokenizer files of `kind`, written under `directory`."""
  if kind.startswith("sentencepiece") or kind == "modernbert-sentencepiece":
    model_type = "bpe" if kind.endswith("bpe") else "unigram"
    tokenization.train_sentencepiece(iter(TRAINING), os.path.join(directory, "vocab"), 1000,
                                     model_type=model_type)
    return [os.path.join(directory, "vocab.model")]
  if kind.startswith("wordpiece"):
    return _wordpiece_vocab(directory, lowercase=kind.endswith("uncased"))
  return [write_modernbert_like_tokenizer(os.path.join(directory, "tokenizer.json"))]


def _model_dir(kind, directory):
  """A random small BERT or ModernBERT model directory with a tokenizer of `kind`; returns
  (its path, its tokenizer)."""
  source = os.path.join(directory, "source")
  os.makedirs(source)
  files = _tokenizer_files(kind, source)
  tok = tokenization.load_tokenizer(files[0])
  if kind.startswith("modernbert"):
    config = bert_config("tiny", "modernbert", vocab_size=tok.vocab_size, hidden_size=64,
                         num_layers=2, num_heads=2, intermediate_size=96, local_attention=8,
                         max_position_embeddings=128)
  else:
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=64, num_layers=2, num_heads=2,
                        intermediate_size=128, max_position_embeddings=128)
  ids = jnp.zeros((1, 4), jnp.int32)
  params = heads.BertForPreTraining(config, next_sentence=not config.is_modernbert).init(
      jax.random.PRNGKey(0), ids, ids, ids, deterministic=True)["params"]
  out = os.path.join(directory, "model")
  model_files.save_model_dir(out, jax.tree.map(np.asarray, nn.unbox(params)), config, files)
  return out, model_files.load_tokenizer(out)


KINDS = ["sentencepiece-unigram", "sentencepiece-bpe", "wordpiece-uncased", "wordpiece-cased",
         "modernbert-sentencepiece", "modernbert-bpe"]


@pytest.mark.parametrize("kind", KINDS)
def test_exported_tokenizer_gives_bertjax_ids_and_the_model_its_logits(kind, tmp_path):
  model_dir, tok = _model_dir(kind, str(tmp_path))
  hf_dir = str(tmp_path / "hf")
  cli.to_hf_dir(model_dir, hf_dir)
  theirs = transformers.AutoTokenizer.from_pretrained(hf_dir)

  # Ids: single texts and pairs, with BERT's [CLS] A [SEP] B [SEP].
  modernbert = kind.startswith("modernbert")
  for text in HELD_OUT + ODD:
    assert theirs(text)["input_ids"] == [tok.cls_id, *tok.encode(text), tok.sep_id], text
  for a, b in PAIRS:
    encoded = theirs(a, b)
    ours_a, ours_b = tok.encode(a), tok.encode(b)
    assert encoded["input_ids"] == [tok.cls_id, *ours_a, tok.sep_id, *ours_b, tok.sep_id]
    if modernbert:
      assert "token_type_ids" not in encoded  # ModernBERT has no segment embeddings
    else:
      assert encoded["token_type_ids"] == [0] * (len(ours_a) + 2) + [1] * (len(ours_b) + 1)
  assert theirs.pad_token_id == tok.pad_id and theirs.mask_token_id == tok.mask_id
  assert theirs.model_max_length == 128

  # Logits: the exported model on the exported tokenizer's batch = bertjax on the same ids.
  batch = theirs(HELD_OUT[:4], padding=True, return_tensors="np")
  ids, mask = batch["input_ids"], batch["attention_mask"]
  segments = batch.get("token_type_ids", np.zeros_like(ids))
  params, config = hf.load_bertjax_checkpoint(model_dir)
  ours = heads.BertForPreTraining(config, next_sentence=not modernbert).apply(
      {"params": params}, ids, segments, mask, deterministic=True)
  ours = np.asarray(ours[0] if isinstance(ours, tuple) else ours)[..., :config.vocab_size]
  cls = transformers.ModernBertForMaskedLM if modernbert else transformers.BertForPreTraining
  model = cls.from_pretrained(hf_dir).eval()
  with torch.no_grad():
    out = model(**{k: torch.tensor(v) for k, v in batch.items()})
  logits = (out.logits if modernbert else out.prediction_logits).numpy()
  real = mask.astype(bool)
  np.testing.assert_allclose(ours[real], logits[real], rtol=0, atol=2e-5)

  # And back: --from=hf of the export is a model directory with the same tokenizer.
  cli.from_hf_dir(hf_dir, str(tmp_path / "back"))
  back = model_files.load_tokenizer(str(tmp_path / "back"))
  assert type(back) is type(tok)
  assert [back.encode(text) for text in HELD_OUT] == [tok.encode(text) for text in HELD_OUT]


def _wordpiece_json(pieces):
  tok = HFTokenizer(models.WordPiece({p: i for i, p in enumerate(pieces)}, unk_token="[UNK]"))
  return tok.to_str()


@pytest.mark.parametrize("problem,expected", [
    ("truncated tokenizer.json", "is not valid JSON"),
    ("tokenizer.json not JSON", "is not valid JSON"),
    ("WordPiece tokenizer.json alone", "no vocab.txt beside tokenizer.json"),
    ("33 pieces for 806 rows", "has 33 ids but the model 806 rows (more than 128 of padding)"),
    ("900 pieces for 806 rows", "has 900 ids but the model 806 rows; they do not belong"),
])
def test_from_hf_refuses_a_tokenizer_that_does_not_go_with_the_model(problem, expected, tmp_path,
                                                                      capsys):
  """The tokenizer beside a Hugging Face checkpoint is read, and checked against the model's
  rows, before anything is written: exit 2, one message, no destination."""
  torch.manual_seed(0)
  model = transformers.BertForPreTraining(transformers.BertConfig(
      vocab_size=806, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
      intermediate_size=37, max_position_embeddings=64))
  src = tmp_path / "hf"
  model.save_pretrained(str(src))
  pieces = SPECIALS + [f"w{i}" for i in range(801)]
  count = {"33 pieces for 806 rows": 33, "900 pieces for 806 rows": 900}.get(problem, 806)
  if problem != "WordPiece tokenizer.json alone":
    (src / "vocab.txt").write_text("".join(p + "\n" for p in (SPECIALS + [
        f"w{i}" for i in range(count - len(SPECIALS))])), encoding="utf-8")
  text = {"truncated tokenizer.json": _wordpiece_json(pieces)[:500],
          "tokenizer.json not JSON": "<html>not found</html>",
          "WordPiece tokenizer.json alone": _wordpiece_json(pieces)}.get(problem)
  if text is not None:
    (src / "tokenizer.json").write_text(text, encoding="utf-8")
  dst = tmp_path / "out"
  assert cli.main(["--from=hf", f"--src={src}", f"--dst={dst}"]) == 2
  err = capsys.readouterr().err
  assert err.count("convert: error:") == 1 and expected in err, err
  assert not dst.exists()
