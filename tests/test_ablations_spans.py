"""The ablations' contiguous spans (No NSP and the left-to-right LM, the paper's section 5.1):
each document cut into spans, each pass elsewhere, each span cut into segments A and B or padded
as one segment, and batches of them training both segment embeddings.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from bertjax.data.pretraining import layout, loader, masking, pairs, preparation, shards
from bertjax.errors import UserError
from bertjax.models import heads
from bertjax.models.config import bert_config
from bertjax.tasks import pretraining

from ablations_helpers import jit


def test_contiguous_spans_cut_each_document_and_each_pass_elsewhere():
  documents = [[[1, 2, 3], [4, 5, 6, 7]], [[8]], [[], []], [[9, 10], [11, 12, 13, 14, 15]]]
  spans = list(pairs.iter_contiguous_spans(documents, 7, np.random.default_rng(0)))
  assert [np.concatenate([a, b]).tolist() for a, b, _ in spans] == [
      [1, 2, 3, 4], [5, 6, 7], [8], [9, 10, 11, 12], [13, 14, 15]]
  # Cut into A and B at the sentence boundary inside the span; inside one sentence at a token.
  assert [(a.tolist(), b.tolist()) for a, b, _ in spans[:1] + spans[3:4]] == [
      ([1, 2, 3], [4]), ([9, 10], [11, 12])]
  assert all(len(a) and len(b) for a, b, _ in spans[:2] + spans[3:])
  assert spans[2][0].tolist() == [8] and not len(spans[2][1])  # one token: `[CLS] A [SEP]`
  assert not any(is_random for _, _, is_random in spans)
  # Pass 1 of 3 cuts first at 4 * 1 // 3 = 1, pass 2 at 2: every token once a pass.
  spans = [np.concatenate([a, b]).tolist()
           for a, b, _ in pairs.iter_contiguous_spans(documents, 7, np.random.default_rng(0), 3)]
  assert spans[5:11] == [[1], [2, 3, 4, 5], [6, 7], [8], [9], [10, 11, 12, 13]]
  assert spans[12:14] == [[1, 2], [3, 4, 5, 6]]
  assert sum(map(len, spans)) == 3 * 15
  with pytest.raises(UserError, match="no room"):
    list(pairs.iter_contiguous_spans(documents, 4, np.random.default_rng(0)))


def test_spans_pad_as_one_segment():
  """A span without B (of one token, or any span of data prepared before the spans were cut in
  two) is `[CLS] span [SEP]`, one segment; a left-to-right LM predicts each next token."""
  special = masking.SpecialTokens(pad=0, cls=2, sep=3, mask=4, vocab_size=20)
  padded = pairs.pad_pairs([(np.array([7, 8, 9]), np.zeros(0, np.int32), False)], 7, special)
  np.testing.assert_array_equal(padded["input_ids"], [[2, 7, 8, 9, 3, 0, 0]])
  np.testing.assert_array_equal(padded["segment_ids"], np.zeros((1, 7)))
  np.testing.assert_array_equal(padded["input_mask"], [[1, 1, 1, 1, 1, 0, 0]])
  record = shards.encode_pair(np.array([7, 8, 9]), np.zeros(0), False, np.dtype(np.uint16))
  decoded = shards.decode_pairs([record], np.dtype(np.uint16), 5, cls=2, sep=3)
  np.testing.assert_array_equal(decoded["input_ids"], [[2, 7, 8, 9, 3]])
  np.testing.assert_array_equal(decoded["input_mask"], [[1, 1, 1, 1, 1]])
  targets = loader.NextTokens(special, seed=0).apply(padded, np.array([0]), None)
  np.testing.assert_array_equal(targets["masked_lm_positions"], [[0, 1, 2, 3, 4, 5]])
  np.testing.assert_array_equal(targets["masked_lm_ids"], [[7, 8, 9, 3, 0, 0]])
  np.testing.assert_array_equal(targets["masked_lm_weights"], [[1, 1, 1, 1, 0, 0]])


def test_ablation_batches_train_both_segment_embeddings(corpus, tmp_path):
  """The No NSP and LTR batches of contiguous spans hold segment ids 0 and 1 (each span cut into
  A and B), so the segment-B row of the token type embeddings gets a gradient from both
  objectives, as BERT's pairs give it; spans of one segment (data prepared before the cut)
  would leave that row untrained for fine-tuning on pairs."""
  text_file, vocab = corpus
  data_dir = str(tmp_path / "data")
  preparation.prepare(layout.Options(input=text_file, vocab=vocab, max_seq_length=(32,),
                                     dupe_factor=1, contiguous=True), data_dir, workers=1,
                      progress=False)
  data = loader.PreparedData(data_dir)
  special = masking.SpecialTokens.from_tokenizer(data.tokenizer())
  for left_to_right in (False, True):
    targets = (loader.NextTokens(special, 0) if left_to_right else
               loader.Masking(special, 0.15, 5, True, 0, None))
    batch, _ = next(loader.PairBatches(data, 32, targets, batch_size=16, threads=1,
                                       contiguous=True).iterate())
    assert (batch["segment_ids"] == 1).any(axis=1).all(), left_to_right
    config = bert_config("tiny", vocab_size=special.vocab_size, num_layers=1,
                         max_position_embeddings=32, dropout_rate=0.0,
                         attention_dropout_rate=0.0, causal=left_to_right)
    model = heads.BertForPreTraining(config, next_sentence=False)
    terms_fn = pretraining.make_terms(baseline_token=5, nsp=False, left_to_right=left_to_right)
    loss_name = "next_token_loss" if left_to_right else "mlm_loss"

    def loss(params, batch):
      values, weights = terms_fn(heads.apply_to_batch(model, params, batch, deterministic=True),
                                 batch)[loss_name]  # pylint: disable=cell-var-from-loop
      return jnp.sum(values * weights) / jnp.sum(weights)

    def segment_rows_grad(params, batch):
      grads = traverse_util.flatten_dict(jax.grad(loss)(params, batch), sep="/")
      [name] = [n for n in grads if "token_type_embeddings" in n]
      return jnp.abs(grads[name]).sum(axis=-1)  # [type_vocab_size]

    params = nn.unbox(heads.init_from_batch(model, jax.random.key(0), batch))
    one_segment = {**batch, "segment_ids": np.zeros_like(batch["segment_ids"])}
    rows_grad = jit(segment_rows_grad)  # one compilation for both batches
    cut, uncut = rows_grad(params, batch), rows_grad(params, one_segment)
    assert cut[0] > 0 and cut[1] > 0, (left_to_right, cut)
    assert uncut[1] == 0, (left_to_right, uncut)  # what the spans without a cut trained
