"""Reading SQuAD: splitting a context into words, read_examples' questions and answers as
run_squad.py reads them (and the misplaced or impossible answers it skips or refuses), and the
errors that name a SQuAD file that cannot be read.
"""
import pytest

from bertjax.data.finetuning import squad as squad_data
from bertjax.errors import UserError

from squad_helpers import QUESTION


def test_split_words():
  words, char_to_word = squad_data.split_words(" a b\u202fcd\n")
  assert words == ("a", "b", "cd")
  assert char_to_word == [-1, 0, 0, 1, 1, 2, 2, 2]  # whitespace belongs to the word before it


def _dataset(*qas, context="word0 key (Zorbax), word1."):
  return {"version": "1.1", "data": [{"title": "t", "paragraphs": [
      {"context": context, "qas": list(qas)}]}]}


def test_read_examples():
  zorbax = {"id": "q1", "question": QUESTION,
            "answers": [{"text": "Zorbax", "answer_start": 11}]}
  misplaced = {"id": "q2", "question": QUESTION,  # "word1" is not at character 0
               "answers": [{"text": "word1", "answer_start": 0}]}
  impossible = {"id": "q3", "question": QUESTION, "answers": [], "is_impossible": True}
  examples = squad_data.read_examples(_dataset(zorbax, misplaced), is_training=True,
                                      version_2_with_negative=False)
  assert examples == [squad_data.Example("q1", QUESTION, ("word0", "key", "(Zorbax),", "word1."),
                                         "Zorbax", 2, 2)]  # q2 is skipped, as run_squad does
  examples = squad_data.read_examples(_dataset(zorbax, impossible), is_training=True,
                                      version_2_with_negative=True)
  assert [(e.qas_id, e.is_impossible, e.start_position) for e in examples] == [
      ("q1", False, 2), ("q3", True, -1)]
  # Prediction reads every question, answers or not.
  examples = squad_data.read_examples(_dataset(misplaced, impossible), is_training=False,
                                      version_2_with_negative=False)
  assert [e.qas_id for e in examples] == ["q2", "q3"]

  with pytest.raises(UserError, match="version_2_with_negative=True"):
    squad_data.read_examples(_dataset(impossible), is_training=True,
                             version_2_with_negative=False)
  two = dict(zorbax, answers=zorbax["answers"] * 2)
  with pytest.raises(UserError, match="q1 .* has 2 answers; each training question needs "
                     "exactly one"):
    squad_data.read_examples(_dataset(two), is_training=True, version_2_with_negative=False)
  outside = dict(zorbax, answers=[{"text": "Zorbax", "answer_start": 40}])
  with pytest.raises(UserError, match="outside its context"):
    squad_data.read_examples(_dataset(outside), is_training=True, version_2_with_negative=False)
  with pytest.raises(UserError, match=r"data\[0\].paragraphs\[0\].qas\[0\] lacks \"question\""):
    squad_data.read_examples(_dataset({"id": "q"}), is_training=False,
                             version_2_with_negative=False)


def test_read_dataset_errors(tmp_path):
  with pytest.raises(UserError, match="does not exist"):
    squad_data.read_dataset(str(tmp_path / "missing.json"))
  with pytest.raises(UserError, match="is a directory"):
    squad_data.read_dataset(str(tmp_path))
  bad = tmp_path / "bad.json"
  bad.write_text('{"data": [')
  with pytest.raises(UserError, match="not valid JSON"):
    squad_data.read_dataset(str(bad))
  bad.write_bytes(b'{"data": ["caf\xe9"]}')  # Latin-1
  with pytest.raises(UserError, match="not UTF-8"):
    squad_data.read_dataset(str(bad))
  bad.write_text("[1, 2]")
  with pytest.raises(UserError, match="not SQuAD's format"):
    squad_data.read_dataset(str(bad))
