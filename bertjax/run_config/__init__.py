"""A run's config as frozen typed dataclasses: every field of every kind of run, each default
defined once, in this package; and `typed`, the one place where a ConfigDict becomes one.

A config file (bertjax/configs/) starts from `defaults(Schema)`, every field of its kind of run
at its default, and sets its recipe's values; ml_collections then refuses a --config.KEY that
names no field, and a value of the wrong type. `typed(config, Schema)` is the boundary
(`boundary`): `bertjax.tasks.run` calls it once, with the schema of the task that `config.task`
names. It refuses keys that are not fields (a config file's typo), takes the default for fields
that an earlier run's config.json lacks, and derives what follows from the final values (warmup
from train.warmup_proportion, where train.warmup_steps is -1 and the steps are known). Library
code reads the fields as attributes, never with a default of its own.

The kinds, a module each: `PretrainingRun` (`pretraining`: configs/tiny.py and the configs
built on it, whose defaults are the CPU demo's), `FinetuningRun` with one data section per task
(`finetuning`: `GlueRun`, `SquadRun`, `NerRun`, `SwagRun`; configs/finetuning.py's defaults are
the paper's GLUE recipe), `EmbeddingsRun` (`embeddings`: contrastive sentence embeddings) and
`FeaturesRun` (`features`); the sections every training run has are `common`'s.
"""
from bertjax.run_config.boundary import defaults, derived, typed
from bertjax.run_config.common import Divergence, Mesh, Train
from bertjax.run_config.embeddings import (Contrastive, EmbeddingsData, EmbeddingsRun,
                                           EmbeddingsTrain)
from bertjax.run_config.features import FeaturesRun
from bertjax.run_config.finetuning import (FinetuningData, FinetuningDivergence,
                                           FinetuningModel, FinetuningRun, FinetuningTrain,
                                           GlueData, GlueRun, NerData, NerRun, SquadData,
                                           SquadRun, SwagData, SwagRun)
from bertjax.run_config.pretraining import (Objective, PretrainingData, PretrainingModel,
                                            PretrainingRun, PretrainingTrain)

__all__ = ["Contrastive", "Divergence", "EmbeddingsData", "EmbeddingsRun", "EmbeddingsTrain",
           "FeaturesRun", "FinetuningData", "FinetuningDivergence", "FinetuningModel",
           "FinetuningRun", "FinetuningTrain", "GlueData", "GlueRun", "Mesh", "NerData", "NerRun",
           "Objective", "PretrainingData", "PretrainingModel", "PretrainingRun", "PretrainingTrain",
           "SquadData", "SquadRun", "SwagData", "SwagRun", "Train", "TrainingRun", "defaults",
           "derived", "typed"]

# What the trainer (`bertjax.training`) runs: a pretraining or a fine-tuning config (an
# embedding run is a fine-tuning run).
TrainingRun = PretrainingRun | FinetuningRun
