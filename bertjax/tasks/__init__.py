"""The task registry: `config.task` names the job that `bertjax.main` runs.

Pretraining and feature extraction are modules with `run(config, workdir)`. Every fine-tuning
task is a `finetuning.Spec` run by `finetuning.run`; a new one is its spec module, one line
here, and a config of a few lines over configs/finetuning.py.
"""
import functools
from typing import Callable

import ml_collections

from bertjax.data.finetuning import glue as glue_data
from bertjax.errors import UserError
from bertjax.tasks import features, finetuning, glue, ner, pretraining, squad, swag

FINETUNING: dict[str, finetuning.Spec] = {
    # GLUE (configs/glue.py): the task's name picks the GLUE task (ax, which has no training
    # data, is there to say how to predict it).
    **{name: glue.SPEC for name in glue_data.TASKS},
    "ner": ner.SPEC,  # CoNLL-2003 NER (configs/ner.py)
    "swag": swag.SPEC,  # SWAG multiple choice (configs/swag.py)
    "squad": squad.SPEC,  # SQuAD v1.1 / v2.0 (configs/squad.py, configs/squad.py:v2.0)
}
REGISTRY: dict[str, Callable[[ml_collections.ConfigDict, str], object]] = {
    "pretraining": pretraining.run,
    "features": features.run,
    **{name: functools.partial(finetuning.run, spec) for name, spec in FINETUNING.items()},
}


def run(config: ml_collections.ConfigDict, workdir: str):
  """Runs the task that `config.task` names; returns what it returns (the last evaluation)."""
  if config.task not in REGISTRY:
    raise UserError(f"unknown task {config.task!r}; --config.task must be one of "
                    f"{sorted(REGISTRY)}.")
  return REGISTRY[config.task](config, workdir)
