"""The byte-level BPE backend: a `Tokenizer` over a Hugging Face tokenizer.json (ModernBERT's).

A byte-level BPE (GPT-2's scheme; ModernBERT's answerdotai/ModernBERT-base) ships only as a
tokenizer.json: its pieces are byte strings written one character a byte ("Ġ", U+0120, is the
space), and a piece that begins a word carries the space before it ("Ġworld"). This backend reads
the file with the `tokenizers` library and holds its special tokens where the file puts them
(ModernBERT: [UNK] 50280, [CLS] 50281, [SEP] 50282, [PAD] 50283, [MASK] 50284): [PAD] is not
id 0 here. The file's post-processor ("[CLS] $A [SEP]") is not applied, and its padding and
truncation are off: bertjax adds [CLS] and [SEP] and pads rows itself.
"""
from __future__ import annotations

import json
import os

import numpy as np
from tokenizers import Tokenizer as HFTokenizer

from bertjax.errors import UserError
from bertjax.tokenization.tokenizer import (CLS, CONFIG_FILE, HF_TOKENIZER_FILE, MASK, PAD, SEP,
                                            UNK, TokenizersTokenizer, UnreadableVocabulary,
                                            write_atomically)
from bertjax.tokenization.whole_word import is_punctuation

# Files a Hugging Face tokenizer directory holds beside tokenizer.json; `save` writes them along.
COMPANION_FILES = (CONFIG_FILE, "special_tokens_map.json")
_FIX = ("give the tokenizer.json of a byte-level BPE tokenizer (ModernBERT's, as "
        "`save_pretrained` or tokenizers' `Tokenizer.save` writes it).")


def model_type(path: str) -> str | None:
  """The model type ("BPE", "WordPiece", ...) of the tokenizer.json at `path`; None if the file
  is JSON without one. UnreadableVocabulary if it is not a JSON object."""
  return _model_type(_read_json(path)[1])


class ByteLevelBPETokenizer(TokenizersTokenizer):
  """A `Tokenizer` over a byte-level BPE tokenizer.json, through `tokenizers`.

  `encode` gives the pieces `tokenizers` gives (what transformers' tokenizer gives, less its
  [CLS] ... [SEP]), with one difference: the text "[MASK]" (or any special token's text) is
  ordinary pieces, never a special id, as the `Tokenizer` contract and Google's BERT have it;
  transformers turns it into the special id. `decode` is the file's own (byte-level) decoder, so
  it gives back the text exactly; it drops [PAD] [CLS] [SEP] [MASK].

  Fine-tuning readers that encode one word at a time (NER, SQuAD's context: `encode_words`)
  encode " " + word, so that a word gets the pieces it has in running text ("Ġworld"), the first
  word included (transformers' is_split_into_words with add_prefix_space=True); an answer span's
  text (`span_text`) is the decoded text of its pieces, the leading space stripped.

  Words, for whole-word masking: a piece whose text begins with whitespace ("Ġworld", "Ċ")
  begins a word, and so do the special tokens. A piece's text is what the decoder makes of it
  alone. The first piece of a text has no space before it ("Hello" in "Hello world"), so its
  id alone cannot say it starts a word; the masking starts a word after [CLS] and [SEP] anyway,
  and after punctuation (`whole_word.word_starts`). For that rule a piece is punctuation if its
  text, less leading whitespace, is all punctuation, or if it is whitespace alone ("Ċ", the
  newline; Google's BasicTokenizer splits words there too), so the piece after it starts a word.

  Args:
    path: a tokenizer.json whose model is BPE with a ByteLevel decoder and whose vocabulary
      holds [UNK] [CLS] [SEP] [PAD] [MASK].

  Raises:
    UserError: the file is missing, not JSON, not a byte-level BPE tokenizer, unreadable by
      `tokenizers`, lacks a special token, or leaves ids without a piece.
  """

  lowercase = False  # the text goes to the pieces as it is (cased)
  word_prefix = " "  # a word alone gets the pieces it has in running text: "Ġword"
  basic_tokenizer = False  # a word's first piece depends on what stands before it

  def __init__(self, path: str):
    path = os.fspath(path)
    self.path = path
    self._data, config = _read_json(path)
    kind = _model_type(config)
    if kind != "BPE":
      raise UserError(f"{path} is a {kind or 'model-less'} tokenizer, not BPE; {_FIX}")
    if not _holds_type(config.get("decoder"), "ByteLevel"):
      raise UserError(f"{path} is BPE but not byte-level (its decoder is not ByteLevel); bertjax "
                      f"reads byte-level BPE only: {_FIX}")
    try:
      tok = HFTokenizer.from_str(self._data.decode("utf-8"))
    except Exception as e:  # pylint: disable=broad-except  # tokenizers raises plain Exception
      raise UnreadableVocabulary(path, f"does not load in the tokenizers library ({e})",
                                 _FIX) from None
    tok.no_padding()
    tok.no_truncation()
    tok.encode_special_tokens = True  # the text "[MASK]" is text, not the mask (see above)
    self._tok = tok

    vocab = tok.get_vocab(with_added_tokens=True)  # {piece: id}
    if not vocab:
      raise UnreadableVocabulary(path, "holds no pieces", _FIX)
    self.vocab_size = max(vocab.values()) + 1
    self._pieces = [""] * self.vocab_size  # [vocab_size]
    for piece, i in vocab.items():
      self._pieces[i] = piece
    ids = set(vocab.values())
    holes = [i for i in range(self.vocab_size) if i not in ids][:3]
    if holes:
      raise UserError(f"{path} has no piece for ids {holes} (ids must run from 0 to "
                      f"{self.vocab_size - 1}); {_FIX}")
    missing = [t for t in (CLS, SEP, MASK, PAD, UNK) if t not in vocab]
    if missing:
      raise UserError(f"{path} lacks {', '.join(missing)}; bertjax needs the special tokens "
                      f"{CLS} {SEP} {MASK} {PAD} {UNK} (ModernBERT's): add them to the tokenizer "
                      "(tokenizers' add_special_tokens) and save it again.")
    self.pad_id, self.unk_id = vocab[PAD], vocab[UNK]
    self.cls_id, self.sep_id, self.mask_id = vocab[CLS], vocab[SEP], vocab[MASK]
    self._companions = {}  # {file name: bytes} of the files beside tokenizer.json
    if os.path.basename(path) == HF_TOKENIZER_FILE:
      for name in COMPANION_FILES:
        companion = os.path.join(os.path.dirname(path), name)
        if os.path.isfile(companion):
          with open(companion, "rb") as f:
            self._companions[name] = f.read()

    # What each piece is as text; special tokens are words of their own and never punctuation.
    texts = tok.decode_batch([[i] for i in range(self.vocab_size)], skip_special_tokens=False)
    not_text = set(self.special_ids) | {i for i, t in tok.get_added_tokens_decoder().items()
                                        if t.special}
    self._word_start = np.array([t[:1].isspace() for t in texts], bool)  # [vocab_size]
    self._word_start[sorted(not_text)] = True
    self._punctuation = np.array([_separates_words(t) for t in texts], bool)  # [vocab_size]
    self._punctuation[sorted(not_text)] = False

  @property
  def file_contents(self) -> bytes:
    """tokenizer.json's bytes, as read."""
    return self._data

  @property
  def companions(self) -> dict[str, bytes]:
    """{file name: bytes} of tokenizer_config.json and special_tokens_map.json, where they were
    beside tokenizer.json."""
    return dict(self._companions)

  def id_to_token(self, i: int) -> str:
    if not 0 <= int(i) < self.vocab_size:
      raise IndexError(f"id {i} is outside the vocabulary [0, {self.vocab_size})")
    return self._pieces[int(i)]

  def token_to_id(self, token: str) -> int:
    i = self._tok.token_to_id(token)
    return self.unk_id if i is None else i

  def is_word_start(self, ids: np.ndarray) -> np.ndarray:
    return self._word_start[np.asarray(ids)]

  def word_boundary_tables(self) -> tuple[np.ndarray, np.ndarray]:
    return self._word_start.copy(), self._punctuation.copy()

  def save(self, directory: str) -> str:
    """Writes tokenizer.json as read (its bytes), and tokenizer_config.json and
    special_tokens_map.json if they were beside it; returns tokenizer.json's path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, HF_TOKENIZER_FILE)
    write_atomically(path, self._data)
    for name, data in self._companions.items():
      write_atomically(os.path.join(directory, name), data)
    return path


def _separates_words(text: str) -> bool:
  """Whether a piece's text is punctuation (less its leading whitespace) or whitespace alone."""
  rest = text.lstrip()
  return bool(text) and (not rest or all(map(is_punctuation, rest)))


def _read_json(path: str) -> tuple[bytes, dict]:
  """The bytes of the tokenizer.json at `path` and its JSON object; UserError if it is none."""
  if os.path.isdir(path):
    raise UserError(f"tokenizer file {path} is a directory; give the {HF_TOKENIZER_FILE} in it.")
  if not os.path.isfile(path):
    raise UserError(f"tokenizer file {path} does not exist; {_FIX}")
  with open(path, "rb") as f:
    data = f.read()
  try:
    config = json.loads(data.decode("utf-8"))
  except (ValueError, UnicodeDecodeError) as e:
    raise UnreadableVocabulary(path, f"is not valid JSON ({e})", _FIX) from None
  if not isinstance(config, dict):
    raise UnreadableVocabulary(path, "is not a JSON object", _FIX)
  return data, config


def _model_type(config: dict) -> str | None:
  model = config.get("model")
  kind = model.get("type") if isinstance(model, dict) else None
  return kind if isinstance(kind, str) else None


def _holds_type(component, kind: str) -> bool:
  """Whether a tokenizer.json component (a decoder, maybe a Sequence of them) is or holds `kind`."""
  if isinstance(component, dict):
    return component.get("type") == kind or any(_holds_type(c, kind)
                                                for c in component.get("decoders") or ())
  return False
