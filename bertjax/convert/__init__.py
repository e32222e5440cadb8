"""Weight converters between bertjax and other BERT checkpoints.

  hf_rules.py  the tables of rules (BERT's, ModernBERT's): Hugging Face names <-> bertjax paths,
               transforms, task heads
  hf.py        Hugging Face transformers BERT and ModernBERT <-> bertjax (hf_rules applied, both
               ways)
  hf_files.py  a Hugging Face directory: config.json <-> BertConfig, reading the weights safely
  hf_modernbert.py  ModernBERT's config.json <-> BertConfig(architecture='modernbert'), refusals
  tf.py        Google's original TF checkpoints -> bertjax (renamed to Hugging Face names by a
               table of rules, then through hf.py)
  __main__.py  the command line: `python -m bertjax.convert --from=hf|tf|--to=hf --src= --dst=`
"""
