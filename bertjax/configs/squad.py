"""SQuAD fine-tuning (the paper, sections 4.2 and 4.3): answer spans on a pretrained BERT.

  python -m bertjax.main --config=configs/squad.py --workdir=DIR --config.init_checkpoint=CKPT \
      --config.data.train_file=train-v1.1.json --config.data.predict_file=dev-v1.1.json
  python -m bertjax.main --config=configs/squad.py:v2.0 --workdir=DIR \
      --config.init_checkpoint=CKPT --config.data.train_file=train-v2.0.json \
      --config.data.predict_file=dev-v2.0.json

CKPT: a pretraining workdir or a directory from `python -m bertjax.convert --from=hf|tf` (e.g.
Google's BERT-base, uncased). The files are SQuAD's own JSON. The defaults are google-research/
bert's run_squad.py's: 384 tokens, doc_stride 128, questions cut to 64 tokens, 2 epochs, batch
32, learning rate 3e-5 (v2.0: 5e-5, with unanswerable questions), warmup 10%, 20 best answers,
answers of at most 30 tokens. run_squad's README gets f1 88.4, exact_match 81.2 on SQuAD v1.1
dev from BERT-base (uncased) with these settings but batch 12 (the paper: f1 88.5). Writes
eval_results.json (the official scripts' scores) and run_squad's predictions.json,
nbest_predictions.json and, for v2.0, null_odds.json.
"""
from bertjax import run_config
from bertjax.errors import UserError


def get_config(arg=None):
  """arg: "v1.1" (default) or "v2.0" (SQuAD 2.0: unanswerable questions, learning rate 5e-5).
  SQuAD's fields are `bertjax.run_config.SquadRun`'s, each commented there."""
  if arg not in (None, "", "v1.1", "v2.0"):
    raise UserError(f"configs/squad.py takes v1.1 or v2.0 (configs/squad.py:v2.0), not {arg!r}.")
  version_2 = arg == "v2.0"
  config = run_config.defaults(run_config.SquadRun)
  config.data.version_2_with_negative = version_2  # SQuAD 2.0: questions may have no answer
  config.train.num_train_epochs = 2.0  # steps = examples / batch_size * epochs (as run_squad)
  config.train.learning_rate = 5e-5 if version_2 else 3e-5  # run_squad's (v2.0: 5e-5)
  # train.eval_steps > 0: questions whose windows were not all predicted are left out of the
  # scores.
  return config
