"""Shared by the SQuAD tests (test_squad_metrics.py, test_squad_reading.py,
test_squad_windows.py, test_squad_answers.py, test_squad_finetuning.py; test_bilstm.py reads
VOCAB and _write_squad): the vocabulary of the synthetic SQuAD data, a WordPiece tokenizer of it,
two examples whose windows the tests work out by hand, and writing SQuAD JSON whose answer is the
word after "key".
"""
import json

import pytest

from bertjax.data.finetuning import squad as squad_data
from bertjax.tokenization import WordPieceTokenizer

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
FILLER = [f"word{i}" for i in range(30)]
ROOTS, SUFFIXES, COLORS = ["zor", "kel", "mar"], ["##bax", "##lo"], ["red", "blue", "gold"]
VOCAB = (SPECIALS + ["what", "follows", "key", "?", ",", ".", "(", ")", "-"] + FILLER + ROOTS +
         SUFFIXES + COLORS)
# One- or two-piece answer words: "zorbax" is zor ##bax.
ANSWER_WORDS = [r + s[2:] for r in ROOTS for s in SUFFIXES] + COLORS
QUESTION = "What follows key?"


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
  path.write_text("".join(t + "\n" for t in VOCAB))
  return str(path)


@pytest.fixture(scope="module")
def tok(vocab_file):
  return WordPieceTokenizer(vocab_file, lowercase=True)


def _ids(tok, pieces):
  return [tok.token_to_id(p) for p in pieces]


def _windows_examples():
  long = squad_data.Example("q1", QUESTION, ("word0", "word1", "key", "(Zorbax),", "word2",
                                             "word3", "word4", "word5", "word6", "word7"),
                            "Zorbax", 3, 3)
  short = squad_data.Example("q2", QUESTION, ("key", "red"), "red", 1, 1)
  return [long, short]


def _write_squad(path, rng, n, impossible_share):
  """n paragraphs of 35-54 filler words; the answer (capitalized, in "(...),", so that
  get_final_text must trim it) is the answer word (one or two pieces) after "key". An impossible
  question's context has neither."""
  paragraphs = []
  for i in range(n):
    words = list(rng.choice(FILLER, size=rng.integers(35, 55)))
    qa = {"id": f"q{i}", "question": QUESTION, "answers": [], "is_impossible": True}
    if rng.random() >= impossible_share:
      answer = str(rng.choice(ANSWER_WORDS)).capitalize()
      position = int(rng.integers(0, len(words)))
      before = " ".join(words[:position] + ["key"])
      words = [before, f"({answer}),"] + words[position:]
      qa.update(answers=[{"text": answer, "answer_start": len(before) + 2}],
                is_impossible=False)
    paragraphs.append({"context": " ".join(words), "qas": [qa]})
  path.write_text(json.dumps({"version": "v2.0" if impossible_share else "1.1",
                              "data": [{"title": "synthetic", "paragraphs": paragraphs}]}))
  return str(path)
