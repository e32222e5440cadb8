"""Pretraining data prepared by an Apache Beam pipeline: text shards processed on Beam workers.

`python -m bertjax.data.prepare ... --runner=NAME` plans the text shards and writes DATA/plan.json
and the vocabulary on this machine (preparation.py), then `run` processes the unfinished text
shards as a Beam pipeline, one `shard_work.process_text_shard` call per shard, and
preparation.py writes DATA/info.json once the pipeline is done. The files written do not depend
on the runner or the workers.

Every worker reads DATA/plan.json and the vocabulary and writes its shards into DATA, at the path
this machine gives (made absolute here), so DATA must be a directory every worker reads and
writes: local disk for DirectRunner, a mounted bucket (e.g. gcsfuse, /gcs/BUCKET on Dataflow
workers) for a cluster. The input files are read at the same path too (the plan lists their
absolute paths), so put them under a shared mount as well. On Dataflow, for example:

  python -m bertjax.data.prepare --input='/gcs/BUCKET/text/*.txt' \\
      --output_dir=/gcs/BUCKET/data --vocab_size=30522 --max_seq_length=128,512 \\
      --runner=DataflowRunner --project=P --region=R --temp_location=gs://BUCKET/tmp \\
      --requirements_file=requirements.txt

Workers need bertjax installed: list it in --requirements_file, or give --setup_file=./setup.py
from a checkout (or a custom --sdk_container_image). Flags bertjax.data.prepare does not know
go to Beam.
Beam itself: pip install 'bertjax[beam]' (apache-beam==2.77.0).
"""
from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Sequence

from bertjax.data.pretraining import layout, shard_work
from bertjax.errors import UserError

_METRICS = "bertjax.prepare"  # namespace of the pipeline's counters


def check(runner: str, pipeline_args: Sequence[str]) -> None:
  """UserError now, before any work, for what `run` would refuse: Beam not installed, an unknown
  runner, a bad flag value, flags the runner's validation refuses. Starts no job."""
  _pipeline(_import_beam(runner), runner, pipeline_args)


def run(output_dir: str, indices: list[int], runner: str, pipeline_args: Sequence[str]) -> None:
  """Processes text shards `indices` of DATA/plan.json (output_dir) as a Beam pipeline.

  Args:
    output_dir: DATA, holding plan.json and the vocabulary; a directory every worker writes.
    indices: [num_shards] the text shards to process (those without DATA/done/INDEX.json).
    runner: a Beam runner name (DirectRunner, DataflowRunner, FlinkRunner, SparkRunner, ...).
    pipeline_args: further Beam pipeline flags, e.g. ["--project=P", "--region=R"].

  Returns when the pipeline is done (it waits even with --no_wait_until_finish, since
  info.json needs every shard; Ctrl-C cancels the job). Raises UserError as `check` does, or
  when the job ends without writing every shard's done file where this machine sees DATA.
  """
  beam = _import_beam(runner)
  if not indices:
    return
  output_dir = os.path.abspath(output_dir)
  pipeline = _pipeline(beam, runner, pipeline_args)
  _ = (pipeline
       | "TextShards" >> beam.Create(sorted(indices))
       | "Spread" >> beam.Reshuffle()  # else a runner may fuse every shard onto one worker
       | "Process" >> beam.Map(process_shard, output_dir))
  result = pipeline.run()
  try:
    state = result.wait_until_finish()
  except KeyboardInterrupt:  # a remote job outlives this process unless cancelled
    _cancel(result)
    raise
  _check_done(output_dir, indices, runner, state)


def process_shard(index: int, output_dir: str) -> int:
  """The pipeline's work for one element: text shard `index` -> its files in DATA (output_dir),
  counted in the Beam metrics `text_shards` and `records`. Returns `index`."""
  import apache_beam as beam  # pylint: disable=import-outside-toplevel

  plan = os.path.join(output_dir, layout.PLAN_FILE)
  if not os.path.exists(plan):
    raise UserError(f"{plan} is not on this Beam worker; --output_dir must be a directory every "
                    "worker reads and writes at the same path (a mounted bucket such as gcsfuse "
                    "for Dataflow), not the launching machine's local disk.")
  done = shard_work.process_text_shard(output_dir, index)
  beam.metrics.Metrics.counter(_METRICS, "text_shards").inc()
  beam.metrics.Metrics.counter(_METRICS, "records").inc(sum(done["files"].values()))
  return index


def _import_beam(runner: str):
  """The apache_beam module, or UserError saying how to install it."""
  try:
    import apache_beam as beam  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise UserError(f"--runner={runner} needs Apache Beam, which is not installed; "
                    "pip install 'bertjax[beam]' (apache-beam==2.77.0), or leave out --runner to "
                    "use local processes.") from None
  return beam


def _cancel(result) -> None:
  """Cancels a running Beam job, if its runner can (local runners have ended already)."""
  try:
    result.cancel()
  except Exception as e:  # pylint: disable=broad-except
    print(f"prepare: could not cancel the Beam job ({e}); cancel it with the runner's tools.",
          file=sys.stderr)


def _pipeline(beam, runner: str, pipeline_args: Sequence[str]):
  """An empty beam.Pipeline for `runner` and its flags; UserError for an unknown runner, a bad
  flag value or flags the runner's validation refuses (all found before anything runs)."""
  options = _pipeline_options(["--runner=" + runner, *pipeline_args])
  try:
    return beam.Pipeline(options=options)
  except ImportError as e:  # a dotted name not importable, or a runner's extra not installed
    raise UserError(f"--runner={runner} cannot be loaded: {_one_line(e)}; install what it "
                    "needs (e.g. pip install 'apache-beam[gcp]==2.77.0' for DataflowRunner) or "
                    "give module.Class of an importable PipelineRunner.") from None
  except ValueError as e:
    if "Unexpected pipeline runner" in str(e):
      raise UserError(f"--runner={runner}: {_one_line(e)}") from None
    if str(e).startswith("Pipeline has validations errors"):
      problems = [line.strip().rstrip(".") for line in str(e).splitlines()[1:] if line.strip()]
      raise UserError(f"--runner={runner} refused the pipeline flags: {'; '.join(problems)}; "
                      "add or fix those flags.") from None
    raise


def _pipeline_options(args: list[str]):
  """PipelineOptions from command-line flags, parsed now: a bad value (argparse's error, which
  prints Beam's whole usage and exits) becomes a one-line UserError. Flags no Beam option knows
  are left to Beam, which warns and drops them (portable runners pass them on to Java)."""
  from apache_beam.options import pipeline_options  # pylint: disable=import-outside-toplevel

  options = pipeline_options.PipelineOptions(args)
  printed = io.StringIO()
  try:
    with contextlib.redirect_stderr(printed):
      options.get_all_options()
  except SystemExit:
    lines = [line for line in printed.getvalue().splitlines() if line.strip()]
    problem = lines[-1].split("error: ", 1)[-1] if lines else "cannot parse them"
    raise UserError(f"Beam pipeline flags {' '.join(args)}: {problem}; fix the flag's value "
                    "(Beam's PipelineOptions documentation lists them).") from None
  return options


def _check_done(output_dir: str, indices: list[int], runner: str, state) -> None:
  """UserError unless the pipeline ended DONE and every shard's done file is in DATA here."""
  from apache_beam.runners.runner import PipelineState  # pylint: disable=import-outside-toplevel

  if state != PipelineState.DONE:
    raise UserError(f"the {runner} job ended {state}, not DONE; rerun the same command to finish "
                    "it (finished text shards are kept).")
  missing = [i for i in indices if not os.path.exists(layout.done_path(output_dir, i))]
  if missing:
    raise UserError(f"the {runner} job finished but {len(missing)} of {len(indices)} text shards "
                    f"are not in {output_dir} here (e.g. {layout.DONE_DIR}/{missing[0]:05d}.json):"
                    " --output_dir must be a directory every worker writes (a mounted bucket "
                    "such as gcsfuse), not each worker's local disk.")


def _one_line(error: BaseException) -> str:
  return "; ".join(line.strip() for line in str(error).splitlines() if line.strip())
