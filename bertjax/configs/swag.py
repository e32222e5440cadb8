"""SWAG fine-tuning (the paper, section 4.4): pick the right ending of four.

  python -m bertjax.main --config=configs/swag.py --workdir=DIR \
      --config.init_checkpoint=CKPT --config.data.train_file=SWAG/train.csv \
      --config.data.eval_file=SWAG/val.csv [--config.data.predict_file=SWAG/test.csv]

CKPT: a pretraining workdir or a directory from `python -m bertjax.convert --from=hf|tf` (e.g.
Google's BERT-base). SWAG: the data/ directory of the rowanz/swagaf repository (train.csv,
val.csv, test.csv). The defaults are the paper's: 3 epochs, learning rate 2e-5, batch 16, with
BERT's usual warmup 10% and dropout 0.1; the paper gives no sequence length, and 128 is
transformers' run_swag.py default. The paper reports dev accuracy 81.6 (BERT-base) and 86.6
(BERT-large). Writes eval_results.json (dev loss and accuracy), eval_predictions.csv
(id,label,prediction) and, with data.predict_file, test_predictions.csv (id,prediction).
"""
from bertjax import run_config


def get_config(arg=None):
  """SWAG's fields (`bertjax.run_config.SwagRun`, each commented there) and the paper's batch."""
  del arg
  config = run_config.defaults(run_config.SwagRun)
  # data.max_seq_length: [CLS] sent1 [SEP] sent2 ending [SEP], the longer part cut first.
  config.train.batch_size = 16  # global batch of questions (x4 sequences), all devices and hosts
  return config
