"""Converts BERT and ModernBERT checkpoints between Hugging Face transformers and bertjax.

  python -m bertjax.convert --from=hf --src=HF_DIR --dst=OUT
      HF_DIR: a transformers save_pretrained directory (config.json, model.safetensors or
      pytorch_model.bin, tokenizer files) of a BERT or, with model_type "modernbert", a
      ModernBERT (its tokenizer.json). OUT gets checkpoints/0/ (a bertjax checkpoint that
      `--config.init_checkpoint=OUT` starts from), bert_config.json and the tokenizer files.
  python -m bertjax.convert --to=hf --src=OUT --dst=HF_DIR
      OUT: a directory written by --from=hf (or any bertjax checkpoint directory with a
      bert_config.json). HF_DIR gets config.json, model.safetensors and the tokenizer as
      transformers reads it (tokenizer.json, tokenizer_config.json: `bertjax.convert.
      hf_tokenizer`); transformers.BertForPreTraining.from_pretrained(HF_DIR) loads it (a
      ModernBERT: ModernBertForMaskedLM, or the class config.json names) and
      AutoTokenizer.from_pretrained(HF_DIR) gives bertjax's ids.
  python -m bertjax.convert --from=tf --src=GOOGLE_DIR --dst=OUT [--do_lower_case=true|false]
      GOOGLE_DIR: a Google BERT release (bert_config.json, vocab.txt, bert_model.ckpt.*); needs
      TensorFlow (pip install 'bertjax[tf]'). OUT as for --from=hf, plus tokenizer_config.json
      with do_lower_case (given, else inferred from vocab.txt).

The destination must not exist or be empty; nothing is ever overwritten. The task head of a
Hugging Face fine-tuned model (sequence or token classification, question answering, multiple
choice) converts to bertjax's head for that task, and back.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from bertjax.modeldir import model_files, model_options
from bertjax.convert import hf, hf_files, hf_modernbert, hf_rules, hf_tokenizer
from bertjax.convert import tf
from bertjax.errors import UserError


def _check_dst(dst: str) -> None:
  if os.path.exists(dst) and (not os.path.isdir(dst) or os.listdir(dst)):
    raise UserError(f"--dst={dst} exists and is not an empty directory; give a new directory "
                    "(nothing is overwritten).")


def _check_src(src: str) -> None:
  if not os.path.isdir(src):
    raise UserError(f"--src={src} is not a directory; give the checkpoint directory to convert.")


def from_hf_dir(src: str, dst: str) -> hf.ConversionReport:
  """HF_DIR -> a bertjax checkpoint directory; returns the conversion report."""
  _check_src(src)
  _check_dst(dst)
  hf_config = hf_files.load_hf_config(src)
  config = hf_files.hf_config_to_bert_config(hf_config)
  task, num_labels = hf_files.hf_task(hf_config)
  params, report = hf.from_hf(hf_files.load_hf_state_dict(src), config, task, num_labels)
  if model_files.tokenizer_files(src):  # checked before anything is written
    model_options.check_vocabulary(config, model_files.load_tokenizer(src).vocab_size, src)
  model_files.save_model_dir(dst, params, config, model_files.tokenizer_files(src))
  return report


def from_tf_dir(src: str, dst: str, do_lower_case: bool | None = None) -> tf.TfConversion:
  """GOOGLE_DIR -> a bertjax checkpoint directory; returns what was done."""
  _check_src(src)
  _check_dst(dst)
  return tf.convert_dir(src, dst, do_lower_case)


def to_hf_dir(src: str, dst: str) -> str:
  """A bertjax checkpoint directory -> HF_DIR; returns the transformers architecture written."""
  from safetensors.numpy import save_file  # pylint: disable=import-outside-toplevel
  _check_src(src)
  _check_dst(dst)
  params, config = hf.load_bertjax_checkpoint(src)
  tensors = hf.to_hf(params, config)
  architecture = hf.hf_architecture(params, config)
  task, num_labels = hf.params_task(params, config)
  token_ids = (hf_modernbert.special_token_ids(src, config.vocab_size) if config.is_modernbert
               else None)
  os.makedirs(dst, exist_ok=True)
  with open(os.path.join(dst, "config.json"), "w", encoding="utf-8") as f:
    labelled = task and hf_rules.table_of(config).task_heads[task].labelled
    json.dump(hf_files.bert_config_to_hf_config(config, [architecture],
                                                num_labels if labelled else None, token_ids),
              f, indent=2)
    f.write("\n")
  save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
  note = hf_modernbert.dropout_note(config)
  if note:
    print(note)
  if model_files.tokenizer_files(src):
    tokenizer = model_files.load_tokenizer(src)
    files = hf_tokenizer.files_for(tokenizer, "modernbert" if config.is_modernbert else "bert",
                                   config.max_position_embeddings)
    for name, data in files.items():
      with open(os.path.join(dst, name), "wb") as f:
        f.write(data)
  return architecture


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog="convert",
      description="Convert BERT and ModernBERT checkpoints between Hugging Face and bertjax.")
  direction = parser.add_mutually_exclusive_group(required=True)
  direction.add_argument("--from", dest="source", choices=["hf", "tf"],
                         help="convert a checkpoint of this format to bertjax")
  direction.add_argument("--to", dest="target", choices=["hf"],
                         help="convert a bertjax checkpoint to this format")
  parser.add_argument("--src", required=True, help="the directory to convert")
  parser.add_argument("--dst", required=True, help="a new (or empty) directory to write")
  parser.add_argument("--do_lower_case", choices=["true", "false"], type=str.lower,
                      help="--from=tf: the tokenizer's casing (default: inferred from vocab.txt)")
  args = parser.parse_args(argv)
  if args.do_lower_case is not None and args.source != "tf":
    parser.error("--do_lower_case applies only to --from=tf")
  try:
    if args.source == "hf":
      report = from_hf_dir(args.src, args.dst)
      print(f"converted {len(report.loaded)} parameters from {args.src} to {args.dst}"
            + (f", with the task head of {report.task}" if report.task else ""))
      if report.missing:
        print(f"not in the checkpoint, freshly initialised when loaded ({len(report.missing)}): "
              + ", ".join(report.missing))
    elif args.source == "tf":
      lowercase = None if args.do_lower_case is None else args.do_lower_case == "true"
      done = from_tf_dir(args.src, args.dst, lowercase)
      print(f"converted {len(done.report.loaded)} parameters from {done.checkpoint} to "
            f"{args.dst}" + (f", with the task head of {done.report.task}" if done.report.task
                             else ""))
      if done.report.missing:
        print(f"not in the checkpoint, freshly initialised when loaded "
              f"({len(done.report.missing)}): " + ", ".join(done.report.missing))
      if done.ignored:
        print(f"ignored {len(done.ignored)} optimizer variables (global_step, Adam slots), not "
              "converted")
      print(f"tokenizer: do_lower_case={str(done.do_lower_case).lower()} "
            f"({'uncased' if done.do_lower_case else 'cased'}), {done.do_lower_case_from}")
    else:
      architecture = to_hf_dir(args.src, args.dst)
      print(f"wrote {architecture} weights from {args.src} to {args.dst}")
  except UserError as e:
    print(f"convert: error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
