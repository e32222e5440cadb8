"""Tests of bertjax.data.pretraining.pairs and .masking: NSP pairs, MLM masks, by Google's rules."""

import numpy as np
import pytest

from bertjax.data.pretraining import masking, pairs
from bertjax.errors import UserError

# [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4; ids 5..19 are ordinary tokens.
SPECIAL = masking.SpecialTokens(pad=0, cls=2, sep=3, mask=4, vocab_size=20,
                                ids_never_masked=frozenset({1}))
# [CLS] 10 11 12 [SEP] 13 14 15 16 [SEP] [PAD] [PAD]: 10 real tokens, 7 candidates.
TOKENS = np.array([2, 10, 11, 12, 3, 13, 14, 15, 16, 3, 0, 0], np.int32)


class _Coins:
  """A stand-in generator whose random(n) returns given values (for the truncation rule)."""

  def __init__(self, values):
    self.values = list(values)

  def random(self, n):
    out, self.values = self.values[:n], self.values[n:]
    return np.array(out)


def test_special_tokens():
  assert SPECIAL.ids_never_masked == {0, 1, 2, 3, 4}
  np.testing.assert_array_equal(SPECIAL.replacement_ids, np.arange(5, 20))

  class Tok:  # the attributes of bertjax.tokenization.Tokenizer that masking uses
    vocab_size, pad_id, unk_id, cls_id, sep_id, mask_id = 50, 0, 1, 2, 3, 4
    special_ids = frozenset({0, 1, 2, 3, 4, 5})

  special = masking.SpecialTokens.from_tokenizer(Tok())
  assert (special.pad, special.cls, special.sep, special.mask, special.vocab_size) == (
      0, 2, 3, 4, 50)
  assert special.ids_never_masked == {0, 1, 2, 3, 4, 5}
  with pytest.raises(ValueError):
    masking.SpecialTokens(pad=0, cls=2, sep=3, mask=4, vocab_size=4)


# ----------------------------------------------------------------------------------------------
# Masking: exact cases worked out by hand.


def test_mask_tokens_exact():
  # The draws of default_rng(39) for 12 positions:
  #   unit_keys   .502 .539 .136 .306 .579 .791 .151 .229 .940 .666 .765 .659
  #   action      .212 .231 .224 .482 .565 .976 .794 .118 .853 .277 .254 .414
  #   replacement  11   11    2   12   12   11    3    7    4    2    7    5
  # 10 real tokens * 0.3 -> 3 to predict. Units = the 7 candidates (positions 1 2 3 5 6 7 8)
  # with keys .502 .539 .136 .306 .579 .791 .151; the 3 smallest are units 2, 6, 3 =
  # positions 3, 8, 5. Position 3: action .482 -> [MASK]. Position 5: .976 -> random,
  # replacement_ids[11] = 16. Position 8: .853 -> kept (16).
  rng = np.random.default_rng(39)
  masked, positions, ids, weights = masking.mask_tokens(TOKENS, 10, rng, SPECIAL,
                                                        masked_lm_prob=0.3,
                                                        max_predictions_per_seq=4)
  np.testing.assert_array_equal(masked, [2, 10, 11, 4, 3, 16, 14, 15, 16, 3, 0, 0])
  np.testing.assert_array_equal(positions, [3, 5, 8, 0])
  np.testing.assert_array_equal(ids, [12, 13, 16, 0])
  np.testing.assert_array_equal(weights, [1, 1, 1, 0])
  assert masked.dtype == positions.dtype == ids.dtype == np.int32
  assert weights.dtype == np.float32
  # Invariants: labels are the original tokens; only chosen positions change.
  np.testing.assert_array_equal(TOKENS[positions[:3]], ids[:3])
  changed = np.flatnonzero(masked != TOKENS)
  assert set(changed) <= set(positions[:3])
  # The input mask form gives the same result.
  again = masking.mask_tokens(TOKENS, (TOKENS > 0).astype(np.int32), np.random.default_rng(39),
                              SPECIAL, masked_lm_prob=0.3, max_predictions_per_seq=4)
  for a, b in zip(again, (masked, positions, ids, weights)):
    np.testing.assert_array_equal(a, b)


def test_mask_tokens_whole_word_exact():
  # Words: 10 11 | 12 | 13 14 15 | 16 -> units 0 (positions 1-2), 1 (3), 2 (5-7), 3 (8), keys
  # .502 .539 .136 .306, taken in order 2, 3, 0, 1. Case 1: 10 * 0.2 -> 2 to predict. Unit 2
  # (3 pieces) would overshoot: skipped. Unit 3 (position 8): 1. Unit 0 (2 pieces): 3 > 2,
  # skipped. Unit 1 (position 3): 2, done. Position 3: action .482 -> [MASK]; 8: .853 -> kept.
  word_starts = np.array([1, 1, 0, 1, 1, 1, 0, 0, 1, 1, 1, 1], bool)
  masked, positions, ids, weights = masking.mask_tokens(
      TOKENS, 10, np.random.default_rng(39), SPECIAL, masked_lm_prob=0.2,
      max_predictions_per_seq=4, word_starts=word_starts)
  np.testing.assert_array_equal(masked, [2, 10, 11, 4, 3, 13, 14, 15, 16, 3, 0, 0])
  np.testing.assert_array_equal(positions, [3, 8, 0, 0])
  np.testing.assert_array_equal(ids, [12, 16, 0, 0])
  np.testing.assert_array_equal(weights, [1, 1, 0, 0])
  # Case 2: 10 * 0.3 -> 3: unit 2 (positions 5 6 7) fills it at once. Actions .976 (random,
  # replacement_ids[11] = 16), .794 ([MASK]), .118 ([MASK]).
  masked, positions, ids, weights = masking.mask_tokens(
      TOKENS, 10, np.random.default_rng(39), SPECIAL, masked_lm_prob=0.3,
      max_predictions_per_seq=4, word_starts=word_starts)
  np.testing.assert_array_equal(masked, [2, 10, 11, 12, 3, 16, 4, 4, 16, 3, 0, 0])
  np.testing.assert_array_equal(positions, [5, 6, 7, 0])
  np.testing.assert_array_equal(ids, [13, 14, 15, 0])


def test_num_to_predict():
  # round half to even, at least 1, at most max_predictions_per_seq
  np.testing.assert_array_equal(masking.num_to_predict([1, 10, 30, 50, 128, 512], 0.15, 20),
                                [1, 2, 4, 8, 19, 20])
  np.testing.assert_array_equal(masking.num_to_predict([5, 15, 25], 0.1, 20), [0 + 1, 2, 2])


# ----------------------------------------------------------------------------------------------
# Masking: against a literal implementation of the original's loop, and statistics.


def _reference_masks(tokens, n_real, randoms, special, prob, max_pred, word_starts):
  """The original create_masked_lm_predictions as a plain loop, consuming the same randoms."""
  cand = []  # lists of positions, one per unit
  for i in range(n_real):
    if tokens[i] in special.ids_never_masked:
      continue
    if word_starts is not None and cand and not word_starts[i] and cand[-1][-1] == i - 1:
      cand[-1].append(i)
    else:
      cand.append([i])
  order = sorted(range(len(cand)), key=lambda u: randoms.unit_keys[u])
  k = min(max_pred, max(1, int(round(n_real * prob))))
  out, chosen = list(tokens), []
  for u in order:
    if len(chosen) >= k:
      break
    if len(chosen) + len(cand[u]) > k:
      continue
    for i in cand[u]:
      chosen.append(i)
      if randoms.action[i] < 0.8:
        out[i] = special.mask
      elif randoms.action[i] >= 0.9:
        out[i] = special.replacement_ids[randoms.replacement[i]]
  chosen.sort()
  pad = [0] * (max_pred - len(chosen))
  return out, chosen + pad, [tokens[i] for i in chosen] + pad, [1.0] * len(chosen) + pad


def _random_pairs(rng, batch, seq, special, min_len=5):
  """[batch, seq] random unmasked pairs with random lengths and [SEP] positions."""
  ids = np.zeros((batch, seq), np.int32)
  mask = np.zeros((batch, seq), np.int32)
  for r in range(batch):
    n = int(rng.integers(min_len, seq + 1))
    sep = int(rng.integers(2, n - 2))
    ids[r, :n] = rng.choice(special.replacement_ids, n)
    ids[r, 0], ids[r, sep], ids[r, n - 1] = special.cls, special.sep, special.sep
    mask[r, :n] = 1
  return ids, mask


@pytest.mark.parametrize("whole_word", [False, True])
def test_mask_batch_matches_reference_loop(whole_word):
  rng = np.random.default_rng(0)
  ids, mask = _random_pairs(rng, 200, 24, SPECIAL)
  word_starts = rng.random(ids.shape) < 0.5 if whole_word else None
  randoms = masking.draw_mask_randoms(rng, ids.shape, SPECIAL)
  out = masking.apply_masks(ids, mask, randoms, SPECIAL, 0.2, 6, word_starts)
  for r in range(len(ids)):
    row_randoms = masking.MaskRandoms(*(x[r] for x in randoms))
    expected = _reference_masks(list(ids[r]), int(mask[r].sum()), row_randoms, SPECIAL, 0.2, 6,
                                None if word_starts is None else word_starts[r])
    np.testing.assert_array_equal(out["input_ids"][r], expected[0])
    np.testing.assert_array_equal(out["masked_lm_positions"][r], expected[1])
    np.testing.assert_array_equal(out["masked_lm_ids"][r], expected[2])
    np.testing.assert_array_equal(out["masked_lm_weights"][r], expected[3])


def test_mask_batch_rows_match_mask_tokens():
  rng = np.random.default_rng(1)
  ids, mask = _random_pairs(rng, 5, 16, SPECIAL)
  out = masking.mask_batch(ids, mask, np.random.default_rng(7), SPECIAL, 0.15, 4)
  one_by_one = np.random.default_rng(7)
  for r in range(5):
    masked, positions, _, _ = masking.mask_tokens(ids[r], mask[r], one_by_one, SPECIAL, 0.15, 4)
    np.testing.assert_array_equal(out["input_ids"][r], masked)
    np.testing.assert_array_equal(out["masked_lm_positions"][r], positions)


def test_mask_statistics():
  special = masking.SpecialTokens(pad=0, cls=2, sep=3, mask=4, vocab_size=1000,
                                  ids_never_masked=frozenset({1}))
  rng = np.random.default_rng(0)
  ids, mask = _random_pairs(rng, 2000, 128, special, min_len=64)
  ids[:, 5] = np.where(mask[:, 5] > 0, 1, ids[:, 5])  # an [UNK] in each row: never chosen
  out = masking.mask_batch(ids, mask, rng, special, 0.15, max_predictions_per_seq=128)
  weights = out["masked_lm_weights"] > 0  # [batch, 128]
  rows = np.broadcast_to(np.arange(len(ids))[:, None], weights.shape)
  pos = out["masked_lm_positions"][weights]
  chosen = np.zeros(ids.shape, bool)
  chosen[rows[weights], pos] = True
  # Exactly round(0.15 * real tokens) per row, ~15% of all real tokens.
  np.testing.assert_array_equal(weights.sum(1), masking.num_to_predict(mask.sum(1), 0.15, 128))
  assert abs(chosen.sum() / mask.sum() - 0.15) < 0.01
  # Never a special token or padding; labels are the original tokens.
  assert not np.isin(ids[chosen], list(special.ids_never_masked)).any()
  assert mask[chosen].all()
  np.testing.assert_array_equal(out["masked_lm_ids"][weights], ids[chosen])
  # Positions strictly increasing within a row.
  p = np.where(weights, out["masked_lm_positions"], 10**6)
  assert (np.diff(p, axis=1)[weights[:, 1:]] > 0).all()
  # 80% [MASK], 10% random, 10% kept (a random draw equal to the original counts as kept:
  # probability 0.1 / 995).
  new = out["input_ids"][chosen]
  old = ids[chosen]
  assert abs((new == special.mask).mean() - 0.8) < 0.01
  assert abs((new == old).mean() - 0.1) < 0.01
  random = (new != special.mask) & (new != old)
  assert abs(random.mean() - 0.1) < 0.01
  assert not np.isin(new[random], list(special.ids_never_masked)).any()
  # Random replacements are uniform over the non-special vocabulary: ~2900 draws from 995 ids
  # hit ~995 * (1 - exp(-2900 / 995)) = 940 distinct ids, with a mean near 502 +- 5.
  assert len(np.unique(new[random])) > 900
  assert abs(new[random].mean() - special.replacement_ids.mean()) < 20
  # Nothing outside the chosen positions changes.
  np.testing.assert_array_equal(out["input_ids"][~chosen], ids[~chosen])


def test_max_predictions_respected():
  rng = np.random.default_rng(2)
  ids, mask = _random_pairs(rng, 300, 64, SPECIAL, min_len=40)
  for word_starts in (None, rng.random(ids.shape) < 0.6):
    out = masking.mask_batch(ids, mask, rng, SPECIAL, 0.15, max_predictions_per_seq=3,
                             word_starts=word_starts)
    assert out["masked_lm_positions"].shape == (300, 3)
    counts = out["masked_lm_weights"].sum(1)
    assert counts.max() == 3
    if word_starts is None:
      assert (counts == 3).all()


def test_whole_word_masking_keeps_words_whole():
  rng = np.random.default_rng(3)
  ids, mask = _random_pairs(rng, 500, 48, SPECIAL, min_len=20)
  word_starts = rng.random(ids.shape) < 0.4  # long words: many skips
  out = masking.mask_batch(ids, mask, rng, SPECIAL, 0.15, 10, word_starts=word_starts)
  candidate = (mask > 0) & ~np.isin(ids, list(SPECIAL.ids_never_masked))
  num_whole_words = 0
  for r in range(len(ids)):
    chosen = set(out["masked_lm_positions"][r][out["masked_lm_weights"][r] > 0].tolist())
    assert chosen <= set(np.flatnonzero(candidate[r]).tolist())
    word = []  # positions of the current word
    for i in range(ids.shape[1] + 1):
      starts_new = i == ids.shape[1] or not candidate[r, i] or word_starts[r, i] or (
          word and word[-1] != i - 1)
      if starts_new and word:
        taken = [p in chosen for p in word]
        assert all(taken) or not any(taken), (r, word, chosen)
        num_whole_words += all(taken) and len(word) > 1
        word = []
      if i < ids.shape[1] and candidate[r, i]:
        word.append(i)
  assert num_whole_words > 100  # multi-piece words were masked, and whole


def test_mask_batch_speed():
  import time
  special = masking.SpecialTokens(pad=0, cls=2, sep=3, mask=4, vocab_size=30000)
  ids, mask = _random_pairs(np.random.default_rng(0), 64, 128, special, min_len=100)
  rng = np.random.default_rng(1)
  masking.mask_batch(ids, mask, rng, special)
  start = time.perf_counter()
  for _ in range(10):
    masking.mask_batch(ids, mask, rng, special, word_starts=ids % 3 > 0)
  assert (time.perf_counter() - start) / 10 < 0.03  # a few ms; generous for a loaded machine


def test_unmask_restores_tokens():
  rng = np.random.default_rng(4)
  ids, mask = _random_pairs(rng, 50, 32, SPECIAL)
  out = masking.mask_batch(ids, mask, rng, SPECIAL, 0.15, 5)
  assert (out["input_ids"] != ids).any()
  np.testing.assert_array_equal(masking.unmask(out), ids)


# ----------------------------------------------------------------------------------------------
# Next sentence prediction pairs.


def test_segment_pairs_exact():
  # default_rng(0) draws, in the order the rules consume them:
  # doc 0: short? .637 (no). Sentences [10 11] [12 13 14] [15] reach the end (6 < 7 tokens):
  #   a_end = integers(1..2) = 2 -> A = 10 11 12 13 14; random? .041 < .5 yes; target_b = 2;
  #   other doc: integers(2) = 0 -> doc 1 (doc 0 skipped); start integers(2) = 0 -> B = 20 21 22
  #   (3 >= 2); put back [15]. 8 > 7 tokens: one coin .813 -> from the back of the longer A.
  #   chunk [15] (last sentence, alone) -> random without a draw; target_b 6: other doc
  #   integers(2) = 0 -> doc 1, start integers(2) = 1 -> B = 23 (end of doc 1).
  # doc 1: short? .607 (no). [20 21 22] [23]: a_end = integers(1..1) = 1, random? .729 no ->
  #   B = 23.
  # doc 2: short? .544 (no). [30] then [31..36] reaches 7: a_end = 1, random? .935 no.
  docs = [[[10, 11], [12, 13, 14], [15]], [[20, 21, 22], [23]],
          [[30], [31, 32, 33, 34, 35, 36]]]
  ex = pairs.create_segment_pairs(docs, 10, 0.0, np.random.default_rng(0), SPECIAL)
  np.testing.assert_array_equal(ex["input_ids"], [
      [2, 10, 11, 12, 13, 3, 20, 21, 22, 3],
      [2, 15, 3, 23, 3, 0, 0, 0, 0, 0],
      [2, 20, 21, 22, 3, 23, 3, 0, 0, 0],
      [2, 30, 3, 31, 32, 33, 34, 35, 36, 3]])
  np.testing.assert_array_equal(ex["segment_ids"], [
      [0, 0, 0, 0, 0, 0, 1, 1, 1, 1],
      [0, 0, 0, 1, 1, 0, 0, 0, 0, 0],
      [0, 0, 0, 0, 0, 1, 1, 0, 0, 0],
      [0, 0, 0, 1, 1, 1, 1, 1, 1, 1]])
  np.testing.assert_array_equal(ex["input_mask"], ex["input_ids"] > 0)
  np.testing.assert_array_equal(ex["next_sentence_label"], [1, 1, 0, 0])
  assert all(v.dtype == np.int32 for v in ex.values())


def test_truncate_pair_rule():
  # Excess 4. A (6) > B (3): front of A; A (5) > 3: back of A; A (4) > 3: front of A;
  # A (3) == B (3): B on a tie, back of B.
  a, b = pairs._truncate_pair(np.arange(1, 7), np.arange(7, 10), 5, _Coins([.1, .7, .2, .9]))
  np.testing.assert_array_equal(a, [3, 4, 5])
  np.testing.assert_array_equal(b, [7, 8])
  a, b = pairs._truncate_pair(np.arange(1, 3), np.arange(3, 6), 5, _Coins([]))  # fits: untouched
  np.testing.assert_array_equal(np.concatenate([a, b]), np.arange(1, 6))


def _numbered_corpus(rng, num_docs, sentences, max_sentence_len, first_id=5):
  """Documents whose token ids are all distinct: token id -> (document, place in document)."""
  docs, owner, next_id = [], [], first_id
  for d in range(num_docs):
    doc = []
    for _ in range(int(rng.integers(*sentences))):
      n = int(rng.integers(1, max_sentence_len + 1))
      doc.append(list(range(next_id, next_id + n)))
      next_id += n
      owner += [d] * n
    docs.append(doc)
  return docs, np.array([-1] * first_id + owner), next_id


def test_next_sentence_rate():
  # Random B half of the time. A chunk of one sentence always takes a random B (as the
  # original does), which happens with short targets and at document ends; long documents of
  # short sentences and short_seq_prob=0 keep that rare, so the rate is that of the coin.
  rng = np.random.default_rng(5)
  docs, _, vocab = _numbered_corpus(rng, 100, (100, 200), 8)
  special = masking.SpecialTokens(pad=0, cls=2, sep=3, mask=4, vocab_size=vocab)
  labels = pairs.create_segment_pairs(docs, 48, 0.0, rng, special,
                                      dupe_factor=4)["next_sentence_label"]
  assert len(labels) > 7000
  assert abs(labels.mean() - 0.5) < 0.02


def test_segment_pairs_structure():
  rng = np.random.default_rng(5)
  docs, owner, vocab = _numbered_corpus(rng, 100, (20, 60), 12)
  max_seq = 48
  special = masking.SpecialTokens(pad=0, cls=2, sep=3, mask=4, vocab_size=vocab)
  ex = pairs.create_segment_pairs(docs, max_seq, 0.1, rng, special, dupe_factor=3)
  labels = ex["next_sentence_label"]
  assert len(labels) > 2000 and 0.4 < labels.mean() < 0.6
  lengths = ex["input_mask"].sum(1)
  assert lengths.max() <= max_seq
  assert (lengths > 0.75 * max_seq).mean() > 0.7  # most examples fill the sequence
  assert (lengths < 0.5 * max_seq).mean() > 0.03  # short_seq_prob makes some short ones
  for row, label in zip(range(len(labels)), labels):
    ids, seg, n = ex["input_ids"][row], ex["segment_ids"][row], lengths[row]
    seps = np.flatnonzero(ids[:n] == special.sep)
    assert ids[0] == special.cls and len(seps) == 2 and seps[1] == n - 1
    a, b = ids[1:seps[0]], ids[seps[0] + 1:n - 1]
    assert len(a) >= 1 and len(b) >= 1
    np.testing.assert_array_equal(seg[:n], [0] * (len(a) + 2) + [1] * (len(b) + 1))
    assert not ids[n:].any() and not seg[n:].any()
    # A and B are each a contiguous run of one document's text.
    assert (np.diff(a) == 1).all() and (np.diff(b) == 1).all()
    assert len(set(owner[a])) == 1 and len(set(owner[b])) == 1
    if label:  # random next: B comes from another document
      assert owner[a[0]] != owner[b[0]]
    else:  # actual next: B follows A in the same document
      assert owner[a[0]] == owner[b[0]] and a[-1] < b[0]


def test_segment_pairs_long_sentences_are_cut():
  rng = np.random.default_rng(6)
  docs, _, vocab = _numbered_corpus(rng, 10, (1, 5), 100)
  special = masking.SpecialTokens(pad=0, cls=2, sep=3, mask=4, vocab_size=vocab)
  ex = pairs.create_segment_pairs(docs, 16, 0.0, rng, special, dupe_factor=5)
  assert ex["input_ids"].shape[1] == 16
  assert (ex["input_mask"].sum(1) == 16).mean() > 0.9
  assert ((ex["input_ids"] == special.sep).sum(1) == 2).all()


def test_segment_pairs_single_document_terminates():
  docs = [[[5, 6], [7], [8, 9, 10], [11]]]
  ex = pairs.create_segment_pairs(docs, 8, 0.5, np.random.default_rng(0), SPECIAL, dupe_factor=20)
  assert len(ex["input_ids"]) >= 20
  assert (ex["input_mask"].sum(1) <= 8).all()
  docs = [[[5, 6, 7]], [[8]], [], [[]]]  # one-sentence and empty documents
  ex = pairs.create_segment_pairs(docs, 8, 0.0, np.random.default_rng(0), SPECIAL)
  np.testing.assert_array_equal(ex["next_sentence_label"], [1, 1])
  np.testing.assert_array_equal(ex["input_ids"], [[2, 5, 6, 7, 3, 8, 3, 0],
                                                  [2, 8, 3, 5, 6, 7, 3, 0]])


def test_segment_pairs_bad_input():
  with pytest.raises(UserError, match="no tokens"):
    pairs.create_segment_pairs([[], [[]]], 16, 0.1, np.random.default_rng(0), SPECIAL)
  with pytest.raises(UserError, match="max_seq_length"):
    pairs.create_segment_pairs([[[5]]], 4, 0.1, np.random.default_rng(0), SPECIAL)
