"""The one exception type for bad user input.

Raise `UserError` when the user gave us something we cannot use (missing file, empty corpus,
unknown config key, wrong checkpoint shape, text that is not UTF-8, ...). The message must name
the problem and say what to do about it. `bertjax.main` prints it as one line and exits non-zero;
nothing else catches it.
"""


class UserError(Exception):
  """Bad input from the user; the message names the problem and the fix."""
