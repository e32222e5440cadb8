"""Weight converters between bertjax and other BERT checkpoints.

  hf.py        Hugging Face transformers BERT <-> bertjax (a table of rules, both ways)
  hf_files.py  a Hugging Face directory: config.json <-> BertConfig, reading the weights safely
  tf.py        Google's original TF checkpoints -> bertjax (renamed to Hugging Face names by a
               table of rules, then through hf.py)
  __main__.py  the command line: `python -m bertjax.convert --from=hf|tf|--to=hf --src= --dst=`
"""
