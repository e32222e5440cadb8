"""Shared by the GLUE data tests (test_glue_data_reading.py, test_glue_data_encoding.py,
test_glue_data_tfds.py, test_glue_data_submission.py): GLUE's .tsv files as download_glue_data.py
leaves them (FILES, written by the glue_dir fixture), and a tiny WordPiece vocabulary and
tokenizer (the vocab_file and tok fixtures).

The .tsv files copy the layouts download_glue_data.py leaves (header rows, columns, CoLA's
headerless train/dev, MRPC's byte order mark, MNLI's 12/16/10-column files), with rows taken from
the real files.
"""
import pytest

from bertjax import tokenization

FILES = {
    "CoLA/train.tsv": (  # no header: source, label, original label, sentence
        "gj04\t1\t\tOur friends won't buy this analysis, let alone the next one we propose.\n"
        "gj04\t0\t*\tThey drank the pub.\n"
        "cj99\t1\t\tThe \"quoted\" word stays.\n"),
    "CoLA/dev.tsv": "gj04\t1\t\tThe sailors rode the breeze clear of the rocks.\n",
    "CoLA/test.tsv": "index\tsentence\n0\tBill whistled past the house.\n1\tThe car honked.\n",
    "SST-2/train.tsv": "sentence\tlabel\nhide new secretions from the parental units \t0\n"
                       "contains no wit , only labored gags \t0\nthat loves its characters \t1\n",
    "SST-2/test.tsv": "index\tsentence\n0\tuneasy mishmash of styles and genres .\n",
    "MRPC/train.tsv": (
        "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        "1\t702876\t702977\tAmrozi accused his brother , whom he called \" the witness \" , of "
        "deliberately distorting his evidence .\tReferring to him as only \" the witness \" , "
        "Amrozi accused his brother of deliberately distorting his evidence .\n"
        "0\t2108705\t2108831\tYucaipa owned Dominick 's .\tYucaipa bought Dominick 's .\n"),
    "MRPC/test.tsv": "index\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
                     "0\t1089874\t1089925\tPCCW 's chief .\tCurrent Chief .\n"
                     "1\t3019446\t3019327\tThe world .\tThe globe .\n",
    "QQP/train.tsv": (
        "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
        "133273\t213221\t213222\tHow is the life of a math student?\tWhich level is enough?\t0\n"
        "363362\t29356\tHow do I?\n"  # a field missing: skipped, as transformers' QqpProcessor
        "402555\t536040\t536041\tHow do I control my horny emotions?\tHow do you control it?\t1\n"),
    "QQP/test.tsv": "id\tquestion1\tquestion2\n0\tWould the world be ok?\tIs it ok?\n",
    "STS-B/dev.tsv": (
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
        "0\tmain-captions\tMSRvid\t2012test\t0000\tnone\tnone\tA man with a hard hat is dancing."
        "\tA man wearing a hard hat is dancing.\t5.000\n"
        "1\tmain-captions\tMSRvid\t2012test\t0002\tnone\tnone\tA young child is riding a horse."
        "\tA child is riding a horse.\t4.750\n"),
    "STS-B/test.tsv": (
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\n"
        "0\tmain-captions\tMSRvid\t2012test\t0024\tnone\tnone\tA girl is styling her hair."
        "\tA girl is brushing her hair.\n"),
    "MNLI/train.tsv": (
        "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
        "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label\n"
        "0\t31193\t31193n\tgovernment\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tConceptually cream "
        "skimming has two basic dimensions.\tProduct and geography are what make cream skimming "
        "work.\tneutral\tneutral\n"),
    "MNLI/dev_matched.tsv": (
        "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
        "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\t"
        "label5\tgold_label\n"
        "0\t63735\t63735n\tslate\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tThe new rights are nice "
        "enough\tEveryone really likes the newest benefits\tneutral\tentailment\tneutral\tneutral"
        "\tneutral\tneutral\n"
        "1\t91383\t91383c\tgovernment\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tThis site includes a "
        "list.\tThe Government Executive articles are not on the site.\tcontradiction\t"
        "contradiction\tcontradiction\tcontradiction\tcontradiction\tcontradiction\n"),
    "MNLI/dev_mismatched.tsv": (
        "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
        "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\t"
        "label5\tgold_label\n"
        "0\t75290\t75290c\tletters\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tYour contribution helped."
        "\tYour contributions were of no help.\tcontradiction\tcontradiction\tcontradiction\t"
        "contradiction\tcontradiction\tcontradiction\n"),
    "MNLI/test_matched.tsv": (
        "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
        "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\n"
        "0\t31493\t31493\ttravel\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tHierbas is a liqueur.\t"
        "Hierbas is a drink.\n"),
    "MNLI/test_mismatched.tsv": (
        "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
        "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\n"
        "0\t41\t41\tverbatim\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tWhat we ate.\tWe ate.\n"
        "1\t42\t42\tverbatim\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tWho went.\tThey went.\n"),
    "QNLI/dev.tsv": "index\tquestion\tsentence\tlabel\n0\tWhat came into force?\tThe law came "
                    "into force.\tentailment\n1\tWhy?\tBecause.\tnot_entailment\n",
    "RTE/train.tsv": "index\tsentence1\tsentence2\tlabel\n0\tNo weapons were found.\tWeapons "
                     "were found.\tnot_entailment\n",
    "RTE/test.tsv": "index\tsentence1\tsentence2\n0\tMaude fought.\tMaude won.\n",
    "WNLI/dev.tsv": "index\tsentence1\tsentence2\tlabel\n0\tThe drain is clogged with hair. It "
                    "has to be cleaned.\tThe hair has to be cleaned.\t0\n",
    "diagnostic/diagnostic.tsv": "index\tsentence1\tsentence2\n0\tThe cat sat on the mat.\tThe "
                                 "cat did not sit on the mat.\n",
}


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("glue_data")
  for name, text in FILES.items():
    (root / name).parent.mkdir(exist_ok=True)
    (root / name).write_bytes(text.encode("utf-8"))
  return str(root)


WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "##s", "a", ".", "?", "is", "it"]


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
  """[PAD] [UNK] [CLS] [SEP] [MASK] at 0-4, then WORDS (5...), then w0..w59 (18...)."""
  path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
  pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + [f"w{i}" for i in range(60)]
  path.write_text("".join(p + "\n" for p in pieces), encoding="utf-8")
  return str(path)


@pytest.fixture(scope="module")
def tok(vocab_file):
  return tokenization.WordPieceTokenizer(vocab_file, lowercase=True)
