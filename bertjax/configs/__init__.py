"""bertjax's configs: `--config=configs/NAME.py`, or `from bertjax.configs import NAME`."""
