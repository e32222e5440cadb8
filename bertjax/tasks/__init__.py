"""The task registry: `config.task` names the job that `bertjax.main` runs.

A task is a module with `run(config, workdir)`; pretraining and fine-tuning tasks build a
`bertjax.train.Task` and hand it to `bertjax.train.train_and_evaluate`. A new task is a new
module plus one line here.
"""
from typing import Callable

import ml_collections

from bertjax.errors import UserError
from bertjax.data import glue as glue_data
from bertjax.tasks import features, glue, ner, pretraining, squad, swag

REGISTRY: dict[str, Callable[[ml_collections.ConfigDict, str], None]] = {
    "pretraining": pretraining.run,
    "features": features.run,
    # GLUE fine-tuning (configs/glue.py): the task's name picks the GLUE task.
    **{name: glue.run for name in glue_data.TASKS if name != "ax"},
    "ner": ner.run,  # CoNLL-2003 NER (configs/ner.py)
    "swag": swag.run,  # SWAG multiple choice (configs/swag.py)
    "squad": squad.run,  # SQuAD v1.1 / v2.0 (configs/squad.py, configs/squad.py:v2.0)
}


def run(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Runs the task that `config.task` names."""
  if config.task not in REGISTRY:
    raise UserError(f"unknown task {config.task!r}; --config.task must be one of "
                    f"{sorted(REGISTRY)}.")
  REGISTRY[config.task](config, workdir)
