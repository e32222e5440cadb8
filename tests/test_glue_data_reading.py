"""Reading GLUE's .tsv files into examples (bertjax.data.finetuning.glue.read_examples): the
task table, every task and split of the files download_glue_data.py leaves, line endings and
blank lines, and the errors that name the file, line and fix."""
import pytest

from bertjax.data.finetuning import glue
from bertjax.data.finetuning.glue import Example
from bertjax.errors import UserError
from bertjax.tasks import glue as glue_task

from glue_helpers import FILES
from glue_helpers import glue_dir  # noqa: F401  (the fixture)


def test_tasks():
  assert list(glue.TASKS) == ["cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte",
                              "wnli", "ax"]
  assert glue.TASKS["mnli"].labels == ("contradiction", "entailment", "neutral")
  assert glue.TASKS["ax"].labels == glue.TASKS["mnli"].labels
  assert glue.TASKS["rte"].labels == glue.TASKS["qnli"].labels == ("entailment",
                                                                   "not_entailment")
  assert glue.TASKS["mrpc"].labels == glue.TASKS["wnli"].labels == ("0", "1")
  assert glue.TASKS["stsb"].is_regression and glue.TASKS["stsb"].num_labels == 1
  assert not glue.TASKS["mnli"].is_regression and glue.TASKS["mnli"].num_labels == 3
  assert glue.TASKS["ax"].splits == ("test",)
  assert {t for t, _ in glue_task.SUBMISSION_FILES} == set(glue.TASKS)
  for (task, split), name in glue_task.SUBMISSION_FILES.items():
    assert split in glue.TASKS[task].splits and split.startswith("test") and name.endswith(".tsv")


@pytest.mark.parametrize("task, split, expected", [
    ("cola", "train", [
        Example("train-0", "Our friends won't buy this analysis, let alone the next one we "
                "propose.", None, "1"),
        Example("train-1", "They drank the pub.", None, "0"),
        Example("train-2", 'The "quoted" word stays.', None, "1")]),  # no quoting
    ("cola", "dev", [Example("dev-0", "The sailors rode the breeze clear of the rocks.", None,
                             "1")]),
    ("cola", "test", [Example("test-0", "Bill whistled past the house.", None, None),
                      Example("test-1", "The car honked.", None, None)]),
    ("sst2", "train", [Example("train-0", "hide new secretions from the parental units ", None,
                               "0"),
                       Example("train-1", "contains no wit , only labored gags ", None, "0"),
                       Example("train-2", "that loves its characters ", None, "1")]),
    ("sst2", "test", [Example("test-0", "uneasy mishmash of styles and genres .", None, None)]),
    ("mrpc", "train", [
        Example("train-0", 'Amrozi accused his brother , whom he called " the witness " , of '
                "deliberately distorting his evidence .", 'Referring to him as only " the '
                'witness " , Amrozi accused his brother of deliberately distorting his evidence .',
                "1"),
        Example("train-1", "Yucaipa owned Dominick 's .", "Yucaipa bought Dominick 's .", "0")]),
    ("mrpc", "test", [Example("test-0", "PCCW 's chief .", "Current Chief .", None),
                      Example("test-1", "The world .", "The globe .", None)]),
    ("qqp", "train", [
        Example("train-0", "How is the life of a math student?", "Which level is enough?", "0"),
        Example("train-2", "How do I control my horny emotions?", "How do you control it?",
                "1")]),
    ("qqp", "test", [Example("test-0", "Would the world be ok?", "Is it ok?", None)]),
    ("stsb", "dev", [
        Example("dev-0", "A man with a hard hat is dancing.",
                "A man wearing a hard hat is dancing.", "5.000"),
        Example("dev-1", "A young child is riding a horse.", "A child is riding a horse.",
                "4.750")]),
    ("stsb", "test", [Example("test-0", "A girl is styling her hair.",
                              "A girl is brushing her hair.", None)]),
    ("mnli", "train", [Example("train-0", "Conceptually cream skimming has two basic "
                               "dimensions.", "Product and geography are what make cream "
                               "skimming work.", "neutral")]),
    ("mnli", "dev_matched", [
        Example("dev_matched-0", "The new rights are nice enough",
                "Everyone really likes the newest benefits", "neutral"),
        Example("dev_matched-1", "This site includes a list.",
                "The Government Executive articles are not on the site.", "contradiction")]),
    ("mnli", "dev_mismatched", [Example("dev_mismatched-0", "Your contribution helped.",
                                        "Your contributions were of no help.",
                                        "contradiction")]),
    ("mnli", "test_matched", [Example("test_matched-0", "Hierbas is a liqueur.",
                                      "Hierbas is a drink.", None)]),
    ("mnli", "test_mismatched", [Example("test_mismatched-0", "What we ate.", "We ate.", None),
                                 Example("test_mismatched-1", "Who went.", "They went.", None)]),
    ("qnli", "dev", [Example("dev-0", "What came into force?", "The law came into force.",
                             "entailment"),
                     Example("dev-1", "Why?", "Because.", "not_entailment")]),
    ("rte", "train", [Example("train-0", "No weapons were found.", "Weapons were found.",
                              "not_entailment")]),
    ("rte", "test", [Example("test-0", "Maude fought.", "Maude won.", None)]),
    ("wnli", "dev", [Example("dev-0", "The drain is clogged with hair. It has to be cleaned.",
                             "The hair has to be cleaned.", "0")]),
    ("ax", "test", [Example("test-0", "The cat sat on the mat.",
                            "The cat did not sit on the mat.", None)]),
])
def test_read_examples(glue_dir, task, split, expected):
  assert glue.read_examples(task, split, glue_dir) == expected


def test_read_examples_line_endings_and_blank_lines(tmp_path):
  (tmp_path / "RTE").mkdir()
  (tmp_path / "RTE" / "dev.tsv").write_bytes(
      b"index\tsentence1\tsentence2\tlabel\r\n0\tA \xc3\xa9.\tB.\tentailment\r\n\r\n"
      b"1\tC.\tD.\tnot_entailment")
  assert glue.read_examples("rte", "dev", str(tmp_path)) == [
      Example("dev-0", "A \u00e9.", "B.", "entailment"),
      Example("dev-1", "C.", "D.", "not_entailment")]


def test_read_examples_errors(glue_dir, tmp_path):
  with pytest.raises(UserError, match=r"unknown GLUE task 'sst-2'; use one of cola, sst2, mrpc, "
                     r"qqp, stsb, mnli, qnli, rte, wnli, ax\."):
    glue.read_examples("sst-2", "train", glue_dir)
  with pytest.raises(UserError, match=r"GLUE task 'mnli' has no split 'dev'; use one of train, "
                     r"dev_matched, dev_mismatched, test_matched, test_mismatched\."):
    glue.read_examples("mnli", "dev", glue_dir)
  with pytest.raises(UserError, match=r"'ax' has no split 'train'; use one of test\."):
    glue.read_examples("ax", "train", glue_dir)
  missing = str(tmp_path / "nowhere")
  with pytest.raises(UserError) as e:
    glue.read_examples("cola", "train", missing)
  assert str(e.value).startswith(
      f"GLUE cola train needs {missing}/CoLA/train.tsv, but {missing} does not exist; get GLUE "
      "with download_glue_data.py (--data_dir=DIR writes DIR/CoLA/train.tsv")
  assert "TFDS glue/<task>" in str(e.value)
  with pytest.raises(UserError, match=rf"needs {tmp_path}/SST-2/dev\.tsv, but {tmp_path}/SST-2 "
                     "does not exist"):
    glue.read_examples("sst2", "dev", str(tmp_path))
  with pytest.raises(UserError, match=rf"GLUE mrpc dev needs {glue_dir}/MRPC/dev\.tsv, but "
                     rf"{glue_dir}/MRPC/dev\.tsv does not exist"):
    glue.read_examples("mrpc", "dev", glue_dir)

  def write(directory, name, data):
    (tmp_path / directory).mkdir(exist_ok=True)
    (tmp_path / directory / name).write_bytes(data)
    return str(tmp_path / directory / name)

  path = write("RTE", "train.tsv", b"index\tsentence1\tsentence2\tlabel\n0\tCaf\xe9.\tB.\t0\n")
  with pytest.raises(UserError, match=rf"{path} is not UTF-8: line 2, byte offset 37"):
    glue.read_examples("rte", "train", str(tmp_path))
  path = write("MNLI", "train.tsv", FILES["MNLI/train.tsv"].encode() +
               b"1\t2\t3\tgenre\ta\tb\tc\td\tPremise only.\tHypothesis.\n")
  with pytest.raises(UserError, match=rf"{path}:3: 10 tab-separated columns, but GLUE mnli train "
                     "rows have at least 11; the file is damaged or not GLUE's"):
    glue.read_examples("mnli", "train", str(tmp_path))
  path = write("CoLA", "train.tsv", b"gj04\t1\t\tFine.\nA headerless row\tof two\n")
  with pytest.raises(UserError, match=rf"{path}:2: 2 tab-separated columns, but GLUE cola train "
                     "rows have at least 4"):
    glue.read_examples("cola", "train", str(tmp_path))
  path = write("RTE", "dev.tsv", b"index\tsentence1\tsentence2\tlabel\n0\tA.\tB.\tneutral\n")
  with pytest.raises(UserError, match=rf"{path}:2: GLUE rte label 'neutral' is not one of "
                     "entailment, not_entailment"):
    glue.read_examples("rte", "dev", str(tmp_path))
  path = write("STS-B", "train.tsv", b"index\tg\tf\ty\to\ts1\ts2\tsentence1\tsentence2\tscore\n"
               b"0\tg\tf\ty\to\tn\tn\tA.\tB.\thigh\n")
  with pytest.raises(UserError, match=rf"{path}:2: GLUE stsb label 'high' is not a number"):
    glue.read_examples("stsb", "train", str(tmp_path))
  (tmp_path / "WNLI" / "dev.tsv").mkdir(parents=True)
  with pytest.raises(UserError, match=r"WNLI/dev\.tsv is a directory"):
    glue.read_examples("wnli", "dev", str(tmp_path))
