"""The GLUE leaderboard files (bertjax.tasks.glue.write_submission): one prediction per test
example, classes by name or best score, STS-B scores clipped and rounded, and predictions that
do not fit refused."""
import os

import numpy as np
import pytest

from bertjax.data.finetuning import glue
from bertjax.data.finetuning.glue import Example
from bertjax.errors import UserError
from bertjax.tasks import glue as glue_task

from glue_helpers import glue_dir  # noqa: F401  (the fixture)


def test_write_submission(tmp_path, glue_dir):
  examples = glue.read_examples("mnli", "test_mismatched", glue_dir)
  path = tmp_path / "sub" / glue_task.SUBMISSION_FILES[("mnli", "test_mismatched")]
  glue_task.write_submission(glue.TASKS["mnli"], "test_mismatched", examples, np.array([2, 0]),
                        str(path))
  assert path.name == "MNLI-mm.tsv"
  assert path.read_text() == "index\tprediction\n0\tneutral\n1\tcontradiction\n"
  # Scores [N, num_labels] give their best class.
  examples = [Example("test-5", "a", "b", None), Example("test-9", "c", "d", None)]
  glue_task.write_submission(glue.TASKS["mrpc"], "test", examples,
                        np.array([[0.1, 0.9], [2.0, -1.0]]), str(path))
  assert path.read_text() == "index\tprediction\n5\t1\n9\t0\n"
  glue_task.write_submission(glue.TASKS["stsb"], "test", examples, np.array([5.23456, -0.2]),
                        str(path))
  assert path.read_text() == "index\tprediction\n5\t5.000\n9\t0.000\n"
  glue_task.write_submission(glue.TASKS["stsb"], "test", examples, np.array([[3.14159], [2.0]]),
                        str(path))
  assert path.read_text() == "index\tprediction\n5\t3.142\n9\t2.000\n"
  glue_task.write_submission(glue.TASKS["ax"], "test", examples, np.array([1, 2]), str(path))
  assert path.read_text() == "index\tprediction\n5\tentailment\n9\tneutral\n"
  assert os.listdir(tmp_path / "sub") == ["MNLI-mm.tsv"]  # no temporary file left
  with pytest.raises(ValueError, match=r"predictions have shape \(3,\); want \(2,\) or \(2, 2\)"):
    glue_task.write_submission(glue.TASKS["rte"], "test", examples, np.array([0, 1, 1]), str(path))
  with pytest.raises(ValueError, match=r"prediction 2 for test-9 is not a class of rte"):
    glue_task.write_submission(glue.TASKS["rte"], "test", examples, np.array([0, 2]), str(path))
  with pytest.raises(ValueError, match=r"example test-5 is not of split 'dev'"):
    glue_task.write_submission(glue.TASKS["rte"], "dev", examples, np.array([0, 1]), str(path))
  with pytest.raises(UserError, match=r"'mnli' has no split 'test'"):
    glue_task.write_submission(glue.TASKS["mnli"], "test", examples, np.array([0, 1]), str(path))
