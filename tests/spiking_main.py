"""`python -m bertjax.main` with chosen training batches spiked (`spike_data`, test-only):

  python tests/spiking_main.py PHASE:EXAMPLES[,...] KILL --config=... ...

spikes the batches at those places (`spike_data.place`) and kills the process (SIGKILL) when it
draws a batch the KILL-th time (PHASE:EXAMPLES:TIMES; "-": never).
"""
import sys

from absl import app, logging

from bertjax import main
from bertjax.training import train

import spike_data

if __name__ == "__main__":
  places, kill = sys.argv[1:3]
  train.train_and_evaluate = spike_data.with_stream(spike_data.spiking(
      {tuple(map(int, p.split(":"))) for p in places.split(",")},
      None if kill == "-" else tuple(map(int, kill.split(":")))))
  logging.set_verbosity(logging.WARNING)
  app.run(main.main, argv=[sys.argv[0], *sys.argv[3:]], flags_parser=main.parse_flags)
