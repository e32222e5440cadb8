"""bertjax.convert's task models: each Hugging Face task class (sequence classification and
regression, token classification, question answering, multiple choice) converts whole with
logits equal to transformers', round-trips through the command line, and needs `architectures`
to name its head."""
import numpy as np
import pytest
import torch
import transformers

from bertjax.convert import __main__ as cli
from bertjax.convert import hf, hf_files, hf_rules
from bertjax.errors import UserError
from bertjax.models import heads
from convert_hf_helpers import _assert_encoder_parity, _batch, _close, _flat, _save_hf, _torch_out


# (transformers class, num_labels, bertjax model class, the bertjax head's name).
TASK_MODELS = [
    (transformers.BertForSequenceClassification, 3, heads.BertForSequenceClassification,
     "sequence_classification"),
    (transformers.BertForSequenceClassification, 1, heads.BertForSequenceClassification,
     "sequence_classification"),  # regression (STS-B)
    (transformers.BertForTokenClassification, 5, heads.BertForTokenClassification,
     "token_tagging"),
    (transformers.BertForQuestionAnswering, 2, heads.BertForQuestionAnswering, "span"),
    (transformers.BertForMultipleChoice, 2, heads.BertForMultipleChoice, "multiple_choice"),
]
TASK_IDS = ["sequence_classification", "regression", "token_tagging", "span", "multiple_choice"]


def _task_logits(cls, num_labels, params, config, model, batch):
  """(bertjax's logits, transformers' logits) of a task model on `batch`; multiple choice takes
  the batch's 3 rows as 3 choices of one example, so padding differs between choices."""
  ours_model = cls(config, num_labels) if "num_labels" in cls.__dataclass_fields__ else cls(config)
  if cls is heads.BertForMultipleChoice:
    batch = tuple(x[None] for x in batch)  # [1 example, 3 choices, seq]
  ours = ours_model.apply({"params": params}, *batch, deterministic=True)
  with torch.no_grad():
    theirs = model(torch.tensor(batch[0]), attention_mask=torch.tensor(batch[2]),
                   token_type_ids=torch.tensor(batch[1]))
  if cls is heads.BertForQuestionAnswering:
    return ours, (theirs.start_logits, theirs.end_logits)
  return (ours,), (theirs.logits,)


@pytest.mark.parametrize("hf_cls,num_labels,cls,head", TASK_MODELS, ids=TASK_IDS)
def test_task_model_parity(tmp_path, hf_cls, num_labels, cls, head):
  """Each Hugging Face task class converts whole (encoder and head); the logits agree."""
  model, directory = _save_hf(hf_cls, tmp_path, seed=4, num_labels=num_labels)
  hf_config = hf_files.load_hf_config(directory)
  task, labels = hf_files.hf_task(hf_config)
  assert (task, labels) == (hf_cls.__name__, num_labels)
  config = hf_files.hf_config_to_bert_config(hf_config)
  params, report = hf.from_hf(hf_files.load_hf_state_dict(directory), config, task, labels)
  assert report.task == task and set(params) == {"bert", head}
  assert sorted(_flat(params[head])) == ["classifier/bias", "classifier/kernel"]
  has_pooler = head in ("sequence_classification", "multiple_choice")
  assert ("pooler" in params["bert"]) == has_pooler
  assert all(p.startswith(("masked_lm/", "next_sentence/", "bert/pooler/"))
             for p in report.missing)  # the pretraining heads (and pooler) it lacks
  batch = _batch()
  _assert_encoder_parity(params, config, _torch_out(model.bert, *batch), batch,
                         pooler=has_pooler)
  ours, theirs = _task_logits(cls, num_labels, params, config, model, batch)
  for o, t in zip(ours, theirs):
    assert o.shape == tuple(t.shape)
    _close(o, t)


@pytest.mark.parametrize("hf_cls,num_labels,cls,head", TASK_MODELS[::2], ids=TASK_IDS[::2])
def test_task_model_round_trips_through_the_cli(tmp_path, hf_cls, num_labels, cls, head, capsys):
  """HF task model -> bertjax -> HF: the same tensors, config and logits; transformers loads it."""
  model, directory = _save_hf(hf_cls, tmp_path / "hf", seed=6, num_labels=num_labels)
  assert cli.main(["--from=hf", f"--src={directory}", f"--dst={tmp_path / 'out'}"]) == 0
  assert f"with the task head of {hf_cls.__name__}" in capsys.readouterr().out
  assert cli.main(["--to=hf", f"--src={tmp_path / 'out'}", f"--dst={tmp_path / 'back'}"]) == 0
  state, back = hf_files.load_hf_state_dict(directory), hf_files.load_hf_state_dict(str(tmp_path / "back"))
  assert sorted(back) == sorted(state)
  for name in state:
    np.testing.assert_array_equal(back[name], state[name], err_msg=name)
  reloaded, info = hf_cls.from_pretrained(str(tmp_path / "back"), output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"]
  if hf_rules.TASK_HEADS[hf_cls.__name__].labelled:
    assert reloaded.config.num_labels == num_labels
  ids, _, mask = (torch.tensor(x[None] if head == "multiple_choice" else x) for x in _batch())
  with torch.no_grad():
    a, b = model(ids, attention_mask=mask), reloaded.eval()(ids, attention_mask=mask)
  key = "start_logits" if head == "span" else "logits"
  np.testing.assert_array_equal(a[key].numpy(), b[key].numpy())


def test_task_head_needs_the_architecture(tmp_path):
  """classifier.* is one of three heads: without `architectures` it is named, not guessed."""
  _, directory = _save_hf(transformers.BertForSequenceClassification, tmp_path, num_labels=3)
  hf_config = hf_files.load_hf_config(directory)
  config = hf_files.hf_config_to_bert_config(hf_config)
  with pytest.raises(UserError, match=r"classifier\.weight \(3, 32\) belongs to a task head, "
                     "but config.json's architectures does not name one"):
    hf.from_hf(hf_files.load_hf_state_dict(directory), config)
  assert hf_files.hf_task({**hf_config, "architectures": None}) == (None, 3)
  with pytest.raises(UserError, match=r"classifier\.weight \(3, 32\) -> "
                     r"sequence_classification/classifier/kernel \(32, 3\) \(transpose\), the "
                     r"model expects \(32, 4\)"):
    hf.from_hf(hf_files.load_hf_state_dict(directory), config, "BertForSequenceClassification", 4)
