"""Named-entity recognition fine-tuning on CoNLL-2003 (the paper, section 5.3).

  python -m bertjax.main --config=configs/ner.py --workdir=DIR \
      --config.init_checkpoint=CKPT --config.data.data_dir=CONLL_DIR \
      --config.data.predict_file=test.txt

CKPT: a pretraining workdir or a directory from `python -m bertjax.convert --from=hf|tf`; a
cased model (e.g. Google's cased BERT-base) suits NER. CONLL_DIR: CoNLL-2003 as distributed
(train.txt, valid.txt, test.txt; "word POS chunk NER" lines, -DOCSTART- lines, IOB1 or IOB2
tags). The defaults are the common BERT CoNLL-2003 settings: batch 32, 3 epochs, learning rate
5e-5, warmup 10%, dropout 0.1, 128 tokens (longer sentences are cut into windows of whole
words). Writes labels.json (the tag of each class id), eval_results.json (dev entity-level
precision/recall/F1 by seqeval, token accuracy), eval_predictions.txt and, for
data.predict_file, test_predictions.txt (CoNLL "word gold predicted" lines) and
test_results.json. The paper reports F1 96.4 (dev) and 92.4 (test) for BERT-base, with the
maximal document context around each sentence, which this sentence-level reader does not add.

The feature-based approach (the paper, section 5.3, Table 7): the encoder frozen, its
activations read by a two-layer BiLSTM tagger trained from scratch:

  python -m bertjax.main --config=configs/ner.py:feature_based --workdir=DIR \
      --config.init_checkpoint=CKPT --config.data.data_dir=CONLL_DIR \
      [--config.model.feature_layers=concat_last_four]

model.feature_layers picks Table 7's row (bertjax.models.feature_based.LAYER_COMBINATIONS); the
paper reports dev F1 96.1 for concat_last_four of BERT-base, 0.3 below fine-tuning. It does not
give the tagger's training settings: learning rate 1e-3 (Adam's usual for an LSTM trained from
scratch) is this config's choice, the rest are the fine-tuning defaults.
"""
from bertjax import run_config
from bertjax.errors import UserError


def get_config(arg=None):
  """arg: "" (fine-tuning, the default) or "feature_based" (a BiLSTM on the frozen encoder).
  NER's fields are `bertjax.run_config.NerRun`'s, each commented there."""
  if arg not in (None, "", "feature_based"):
    raise UserError(f"configs/ner.py takes feature_based (configs/ner.py:feature_based), not "
                    f"{arg!r}.")
  config = run_config.defaults(run_config.NerRun)
  config.train.learning_rate = 5e-5  # the common BERT CoNLL-2003 setting
  if arg == "feature_based":
    config.model.feature_layers = "concat_last_four"  # the paper's best (dev F1 96.1)
    config.train.frozen_params = "bert"  # the encoder never changes: no update, no decay
    config.train.learning_rate = 1e-3  # the BiLSTM and the tagger train from scratch
  return config
