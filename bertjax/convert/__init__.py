"""Weight converters between bertjax and other BERT checkpoints.

  hf.py        Hugging Face transformers BERT <-> bertjax (a table of rules, both ways)
  __main__.py  the command line: `python -m bertjax.convert --from=hf|--to=hf --src=... --dst=...`
"""
