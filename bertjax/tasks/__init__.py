"""The task registry: `config.task` names the job that `bertjax.main` runs, and the schema its
config is read into (`bertjax.run_config`).

Pretraining, contrastive embeddings and feature extraction are modules with `run(config,
workdir)`. Every fine-tuning
task is a `finetuning.Spec` run by `finetuning.run`; a new one is its spec module (with its
schema), one line here, and a config of a few lines over configs/finetuning.py.
"""
import dataclasses
import functools
from typing import Any, Callable, Mapping

import ml_collections

from bertjax import run_config
from bertjax.data.finetuning import glue as glue_data
from bertjax.errors import UserError
from bertjax.tasks import embeddings, features, finetuning, glue, ner, pretraining, squad, swag


@dataclasses.dataclass(frozen=True)
class Entry:
  """A task: the schema its config is read into, and what runs it (typed config, workdir)."""
  schema: type
  run: Callable[[Any, str], object]


FINETUNING: dict[str, finetuning.Spec] = {
    # GLUE (configs/glue.py): the task's name picks the GLUE task (ax, which has no training
    # data, is there to say how to predict it).
    **{name: glue.SPEC for name in glue_data.TASKS},
    "ner": ner.SPEC,  # CoNLL-2003 NER (configs/ner.py)
    "swag": swag.SPEC,  # SWAG multiple choice (configs/swag.py)
    "squad": squad.SPEC,  # SQuAD v1.1 / v2.0 (configs/squad.py, configs/squad.py:v2.0)
}
REGISTRY: dict[str, Entry] = {
    "pretraining": Entry(run_config.PretrainingRun, pretraining.run),
    "features": Entry(run_config.FeaturesRun, features.run),
    "embeddings": Entry(run_config.EmbeddingsRun, embeddings.run),
    **{name: Entry(spec.schema, functools.partial(finetuning.run, spec))
       for name, spec in FINETUNING.items()},
}


def typed(config: ml_collections.ConfigDict | Mapping[str, Any]) -> Any:
  """The typed config (`bertjax.run_config.typed`) of the task that `config.task` names.

  Raises:
    UserError: no such task; a key that is no field of its schema, or a value of the wrong type.
  """
  task = config["task"]
  if task not in REGISTRY:
    raise UserError(f"unknown task {task!r}; --config.task must be one of "
                    f"{sorted(REGISTRY)}.")
  return run_config.typed(config, REGISTRY[task].schema)


def run(config: ml_collections.ConfigDict, workdir: str):
  """Runs the task that `config.task` names on its typed config; returns what it returns (the
  last evaluation)."""
  typed_config = typed(config)
  return REGISTRY[typed_config.task].run(typed_config, workdir)
