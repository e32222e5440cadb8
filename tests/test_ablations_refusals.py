"""The pretraining ablations that cannot work, refused before any step with the fix named: an
unknown pretraining.objective, data.packing with either ablation, data prepared without
contiguous spans, and a left-to-right LM on data with static ([MASK]ed) masks.
"""
import dataclasses

import pytest

from bertjax import tasks
from bertjax.data.pretraining import layout, loader, masking, preparation
from bertjax.errors import UserError
from bertjax.tasks import pretraining_config, pretraining_data


def test_ablation_configs_and_data_that_cannot_work_are_refused(corpus, tmp_path):
  """An unknown objective and packing with either ablation are refused at the config; data
  prepared without --contiguous is refused naming that flag; a left-to-right LM on data with
  static ([MASK]ed) tokens is refused."""
  from bertjax.configs import tiny  # pylint: disable=import-outside-toplevel
  text_file, vocab = corpus
  data_dir = str(tmp_path / "data")
  preparation.prepare(layout.Options(input=text_file, vocab=vocab, max_seq_length=(32,),
                                     max_predictions_per_seq=(5,), dupe_factor=1,
                                     static_masks=True), data_dir, workers=1, progress=False)
  data = loader.PreparedData(data_dir)

  def config(**ablation):
    c = tiny.get_config()
    c.data.prepared, c.data.max_seq_length, c.data.max_predictions_per_seq = data_dir, 32, 5
    c.data.dynamic_masking = False
    c.pretraining.update(ablation)
    return tasks.typed(c)

  with pytest.raises(UserError, match="pretraining.objective='bert'; use mlm .* or ltr"):
    pretraining_config.check_config(config(objective="bert"))
  for ablation in (dict(nsp=False), dict(objective="ltr")):
    packed = config(**ablation)
    packed = dataclasses.replace(packed, data=dataclasses.replace(packed.data, packing=True))
    with pytest.raises(UserError, match="are not packed; set data.packing=false"):
      pretraining_config.check_config(packed)
    with pytest.raises(UserError, match="lacks at 32 tokens; prepare the text with "
                                        "--contiguous=true"):
      pretraining_data.check_prepared(data, config(**ablation))
  pretraining_data.check_prepared(data, config())  # the paper's BERT reads this data
  special = masking.SpecialTokens.from_tokenizer(data.tokenizer())
  with pytest.raises(UserError, match="static masks .* Prepare it without --static_masks"):
    loader.PairBatches(data, 32, loader.NextTokens(special, 0), batch_size=8)
