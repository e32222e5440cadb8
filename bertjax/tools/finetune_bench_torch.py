"""finetune_bench's transformers peer: BertForSequenceClassification (PyTorch) fine-tuned for one
epoch on the benchmark's token ids, then scored on the dev set.

  python -m bertjax.tools.finetune_bench_torch --hf_dir=DIR --token_ids=FILE.npz \
      [--batch_size=32] [--eval_batch_size=64] [--seed=0]       # prints one line of JSON

`python -m bertjax.tools.finetune_bench` runs it as a subprocess and times it import to exit,
so it imports none of bertjax's JAX code: what it loads is what the peer needs (numpy, then
torch and transformers). Its recipe is bertjax's (`bertjax.tools.finetune_bench`'s docstring).
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

LEARNING_RATE = 2e-5  # configs/finetuning.py's recipe, which the transformers peer copies
WARMUP_PROPORTION = 0.1
WEIGHT_DECAY = 0.01
ADAM_EPS = 1e-6
CLIP_NORM = 1.0
DROPOUT = 0.1


def transformers_peer(hf_dir: str, token_ids: str, *, batch_size: int, eval_batch_size: int,
                      seed: int) -> dict[str, float]:
  """Fine-tunes BertForSequenceClassification for one epoch, then scores the dev set (module
  docstring); returns {accuracy, and the seconds of load, train and eval}."""
  start = time.perf_counter()
  # Imported here: torch and transformers load inside the timed "load" phase, from its start.
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel

  torch.manual_seed(seed)
  device = "cuda" if torch.cuda.is_available() else "cpu"
  data = dict(np.load(token_ids))
  model = transformers.BertForSequenceClassification.from_pretrained(hf_dir, num_labels=2)
  model.to(device).train()
  decayed = [p for n, p in model.named_parameters() if not n.endswith("bias") and
             "LayerNorm" not in n]
  kept = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
  optimizer = torch.optim.AdamW([{"params": decayed, "weight_decay": WEIGHT_DECAY},
                                 {"params": kept, "weight_decay": 0.0}],
                                lr=LEARNING_RATE, betas=(0.9, 0.999), eps=ADAM_EPS)
  steps = len(data["train_label"]) // batch_size
  schedule = transformers.get_linear_schedule_with_warmup(
      optimizer, int(WARMUP_PROPORTION * steps), steps)

  def tensors(split, rows):
    """The rows' ids, mask and labels, cut to their longest sentence (dynamic padding)."""
    length = int(data[f"{split}_input_mask"][rows].sum(1).max())
    return [torch.from_numpy(data[f"{split}_{key}"][rows, :length]).long().to(device)
            for key in ("input_ids", "input_mask")] + [
                torch.from_numpy(data[f"{split}_label"][rows]).long().to(device)]

  loaded = time.perf_counter()
  order = np.random.default_rng(seed).permutation(len(data["train_label"]))
  for step in range(steps):
    ids, mask, labels = tensors("train", order[step * batch_size:(step + 1) * batch_size])
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
    optimizer.step()
    schedule.step()
    optimizer.zero_grad()
  trained = time.perf_counter()
  model.eval()
  hits, n = 0, len(data["dev_label"])
  with torch.inference_mode():
    for first in range(0, n, eval_batch_size):
      ids, mask, labels = tensors("dev", np.arange(first, min(first + eval_batch_size, n)))
      hits += int((model(input_ids=ids, attention_mask=mask).logits.argmax(-1) == labels).sum())
  done = time.perf_counter()
  return {"accuracy": hits / n, "load_seconds": loaded - start,
          "train_seconds": trained - loaded, "eval_seconds": done - trained}


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m bertjax.tools.finetune_bench_torch",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--hf_dir", required=True, help="the model in Hugging Face's format")
  parser.add_argument("--token_ids", required=True, help="finetune_bench's token_ids.npz")
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--eval_batch_size", type=int, default=64)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  print(json.dumps(transformers_peer(args.hf_dir, args.token_ids, batch_size=args.batch_size,
                                     eval_batch_size=args.eval_batch_size, seed=args.seed)))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
