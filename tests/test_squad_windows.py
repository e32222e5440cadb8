"""run_squad.py's windows: doc_spans and max context, convert_examples_to_features' rows,
labels and token maps for a context longer than one window (worked out by hand in the comments),
and improve_answer_span narrowing an answer to its pieces.
"""
import numpy as np
import pytest

from bertjax.data.finetuning import squad as squad_data
from bertjax.errors import UserError

from squad_helpers import QUESTION, _ids, _windows_examples
from squad_helpers import tok, vocab_file  # noqa: F401  (the fixtures)


def test_doc_spans_and_max_context():
  assert squad_data.doc_spans(10, 4, 2) == [(0, 4), (2, 4), (4, 4), (6, 4)]
  assert squad_data.doc_spans(10, 4, 8) == [(0, 4), (4, 4), (8, 2)]  # steps <= window length
  assert squad_data.doc_spans(3, 4, 2) == [(0, 3)]
  assert squad_data.doc_spans(0, 4, 2) == []
  spans = [(0, 4), (2, 4), (4, 4), (6, 4)]
  # token 2: span 0 scores min(2, 1) + .04, span 1 min(0, 3) + .04 -> 0; token 3: 0.04 vs 1.04
  # -> 1; and so on.
  best = squad_data.max_context(spans, 10).argmax(axis=0)
  np.testing.assert_array_equal(best, [0, 0, 0, 1, 1, 2, 2, 3, 3, 3])
  assert squad_data.max_context(spans, 10).sum(axis=0).tolist() == [1] * 10
  # Equal context on both sides: the longer window wins (1 + 0.04 > 1 + 0.03).
  assert squad_data.max_context([(0, 4), (1, 3)], 4)[:, 2].tolist() == [True, False]


def test_windows(tok):
  # q1's context: word0 word1 key ( zor ##bax ) , word2 ... word7 = 14 tokens; the question is
  # cut to "what follows key" (3); a row of 12 holds 12 - 3 - 3 = 6 context tokens; windows
  # start 4 apart: tokens [0, 6), [4, 10), [8, 14).
  features = squad_data.convert_examples_to_features(
      _windows_examples(), tok, max_seq_length=12, doc_stride=4, max_query_length=3,
      is_training=True)
  assert len(features) == 4
  np.testing.assert_array_equal(features.example_index, [0, 0, 0, 1])
  np.testing.assert_array_equal(features.doc_span_index, [0, 1, 2, 0])
  query = ["[CLS]", "what", "follows", "key", "[SEP]"]
  context = ["word0", "word1", "key", "(", "zor", "##bax", ")", ",", "word2", "word3", "word4",
             "word5", "word6", "word7"]
  for row, start in zip(features.input_ids[:3], (0, 4, 8)):
    assert row.tolist() == _ids(tok, query + context[start:start + 6] + ["[SEP]"])
  assert features.input_ids[3].tolist() == _ids(tok, query + ["key", "red", "[SEP]"]) + [0] * 4
  np.testing.assert_array_equal(features.segment_ids[0], [0] * 5 + [1] * 7)
  np.testing.assert_array_equal(features.segment_ids[3], [0] * 5 + [1] * 3 + [0] * 4)
  np.testing.assert_array_equal(features.input_mask[3], [1] * 8 + [0] * 4)
  # The answer "Zorbax" is word 3, "(Zorbax),": tokens 3..7, narrowed to zor ##bax (4, 5). It is
  # at row positions 5 + 4 - start in windows 0 and 1; window 2 and padding point at [CLS].
  np.testing.assert_array_equal(features.start_position, [9, 5, 0, 6])
  np.testing.assert_array_equal(features.end_position, [10, 6, 0, 6])
  np.testing.assert_array_equal(features.token_to_orig[0],
                                [-1] * 5 + [0, 1, 2, 3, 3, 3] + [-1])
  np.testing.assert_array_equal(features.token_to_orig[3], [-1] * 5 + [0, 1] + [-1] * 5)
  # Max context: tokens 0-4 in window 0, 5-8 in window 1, 9-13 in window 2 (token 4: window 0
  # min(4, 1) vs window 1 min(0, 5); token 8: window 1 min(4, 1) vs window 2 min(0, 5)).
  np.testing.assert_array_equal(features.token_is_max_context[0], [0] * 5 + [1] * 5 + [0] * 2)
  np.testing.assert_array_equal(features.token_is_max_context[1], [0] * 6 + [1] * 4 + [0] * 2)
  np.testing.assert_array_equal(features.token_is_max_context[2], [0] * 6 + [1] * 5 + [0])
  # Impossible questions point at [CLS] in every window; prediction features carry no labels.
  impossible = squad_data.Example("q3", QUESTION, _windows_examples()[0].doc_tokens,
                                  is_impossible=True)
  features = squad_data.convert_examples_to_features(
      [impossible], tok, max_seq_length=12, doc_stride=4, max_query_length=3, is_training=True)
  assert features.start_position.tolist() == features.end_position.tolist() == [0, 0, 0]
  inputs = features.model_inputs(with_labels=False)
  assert sorted(inputs) == ["feature_index", "input_ids", "input_mask", "segment_ids"]
  with pytest.raises(UserError, match="must exceed data.max_query_length"):
    squad_data.convert_examples_to_features(_windows_examples(), tok, max_seq_length=6,
                                            doc_stride=4, max_query_length=3, is_training=True)


def test_improve_answer_span(tok):
  # "(Zorbax-Kello)." is the pieces ( zor ##bax - kel ##lo ) .
  doc = _ids(tok, ["(", "zor", "##bax", "-", "kel", "##lo", ")", "."])
  assert squad_data.improve_answer_span(doc, 0, 7, tok, "Zorbax") == (1, 2)
  assert squad_data.improve_answer_span(doc, 0, 7, tok, "Kello") == (4, 5)
  assert squad_data.improve_answer_span(doc, 0, 7, tok, "Zorbax-Kello") == (1, 5)
  assert squad_data.improve_answer_span(doc, 0, 7, tok, "Marlo") == (0, 7)  # not inside
