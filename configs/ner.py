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
"""
from bertjax.configs import finetuning


def get_config(arg=None):
  config = finetuning.get_config(arg)
  config.task = "ner"  # bertjax.tasks.REGISTRY
  config.data.data_dir = ""  # directory of the files below (absolute file paths need none)
  config.data.train_file = "train.txt"  # CoNLL-format training file; its tags are the classes
  config.data.eval_file = ""  # tagged dev file, scored at each evaluation ("" = valid.txt,
  # else dev.txt)
  config.data.predict_file = ""  # predicted after training into test_predictions.txt, e.g.
  # test.txt (scored into test_results.json when tagged); "" = none
  config.data.label_column = -1  # the tag's column (-1 = the last: CoNLL-2003's NER tags)
  # data.max_seq_length: [CLS] words [SEP]; longer sentences become more rows (train.batch_size
  # counts rows).
  config.train.learning_rate = 5e-5  # the common BERT CoNLL-2003 setting
  return config
