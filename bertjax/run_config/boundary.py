"""The boundary: a ConfigDict becomes a frozen typed run (`typed`), and a config file starts
from every field at its default (`defaults`)."""
from __future__ import annotations

import dataclasses
import typing
from typing import Any, Mapping, TypeVar

import ml_collections

from bertjax.errors import UserError
from bertjax.run_config.common import Train
from bertjax.run_config.finetuning import FinetuningRun
from bertjax.run_config.pretraining import PretrainingRun

Schema = TypeVar("Schema")


def defaults(schema: type) -> ml_collections.ConfigDict:
  """Every field of `schema` at its default, as the ConfigDict a config file starts from."""
  return ml_collections.ConfigDict(dataclasses.asdict(schema()))


def _build(schema: type, values: Mapping[str, Any], prefix: str) -> Any:
  """`schema` from `values` ({field: value}, nested dicts for sections); a field absent from
  `values` takes its default. Raises UserError naming a key that is no field."""
  fields = {f.name: f for f in dataclasses.fields(schema)}
  unknown = sorted(set(values) - set(fields))
  if unknown:
    names = ", ".join(prefix + name for name in unknown)
    raise UserError(f"unknown config key(s) {names} for a {schema.__name__} (its fields are "
                    f"{', '.join(prefix + name for name in fields)}); check the spelling in the "
                    "config file (bertjax/run_config/ lists every field, with comments).")
  hints = typing.get_type_hints(schema)
  kwargs = {}
  for name, value in values.items():
    kind = hints[name]
    if dataclasses.is_dataclass(kind):
      if not isinstance(value, Mapping):
        raise UserError(f"config key {prefix}{name} is a section ({kind.__name__}), not "
                        f"{value!r}.")
      kwargs[name] = _build(kind, value, f"{prefix}{name}.")
    elif kind is float and isinstance(value, int) and not isinstance(value, bool):
      kwargs[name] = float(value)
    elif kind in (int, float, str, bool) and not isinstance(value, kind):
      raise UserError(f"config key {prefix}{name}={value!r} is not a {kind.__name__}; set "
                      f"--config.{prefix}{name} to one.")
    else:
      kwargs[name] = value
  return schema(**kwargs)


def typed(config: ml_collections.ConfigDict | Mapping[str, Any], schema: type[Schema]) -> Schema:
  """The frozen `schema` (a *Run class) of `config` (a ConfigDict or its dict), with the values
  derived from the final ones filled in (`derived`).

  Raises:
    UserError: a key that is no field of `schema`, or a value of the wrong type.
  """
  values = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else dict(config)
  return derived(_build(schema, values, ""))


def derived(value: Schema) -> Schema:
  """`value` (a run, or a train section alone) with train.warmup_steps -1 made warmup_proportion
  of train.num_train_steps where the steps are known (pretraining; a fine-tuning run knows them
  once it has read its data: `bertjax.tasks.finetuning.schedule`)."""
  if isinstance(value, (PretrainingRun, FinetuningRun)):
    return dataclasses.replace(value, train=derived(value.train))
  if not isinstance(value, Train) or value.warmup_steps >= 0 or value.num_train_steps < 0:
    return value
  return dataclasses.replace(
      value, warmup_steps=int(value.warmup_proportion * value.num_train_steps))
