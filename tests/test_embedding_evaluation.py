"""The evaluations of sentence embeddings (bertjax.embedding.evaluation, eval_files, and
`python -m bertjax.embedding.evaluate`) against their references, on one tiny random BERT saved
as a sentence-transformers model (mean pooling, normalised, a "query" prompt):

  - retrieval: sentence-transformers' InformationRetrievalEvaluator on a BEIR-layout set the test
    writes (40 documents with titles, two of them copies of a third, 12 queries, graded qrels):
    every metric at every k, on the same embeddings and end to end from the directory;
  - STS: sentence-transformers' EmbeddingSimilarityEvaluator (and scipy) on a GLUE-style file;
  - transfer: SentEval's InnerKFoldClassifier written out with scikit-learn (StratifiedKFold,
    LogisticRegression) on the same embeddings: the folds, each fold's C and accuracy;
  - docs/embeddings.md's commands as written; every refused input.
"""
import json
import os
import shlex
import warnings

import numpy as np
import pytest
import torch

import docs_text
from bertjax.embedding import embedder, eval_files, evaluate, evaluation
from embedding_helpers import WORDS, hf_bert_dir, sentence_transformer_dir

KS = [1, 3, 5, 10, 100]
ST_NAMES = {"accuracy@k": "accuracy", "precision@k": "precision", "recall@k": "recall",
            "mrr@k": "mrr", "ndcg@k": "ndcg", "map@k": "map"}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
  """(the sentence-transformers directory, the SentenceTransformer it loads as)."""
  root = tmp_path_factory.mktemp("evaluation")
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    encoder = hf_bert_dir(str(root / "bert"))
    st = sentence_transformer_dir(str(root / "st"), encoder, ["mean"], normalize=True,
                               max_seq_length=32)
  return str(root / "st"), st


def _words(rng, n):
  return " ".join(rng.choice(WORDS[10:], size=n))


def write_beir(directory):
  """A BEIR directory: corpus.jsonl (40 documents, ids out of order, some with a title; three of
  them copies, of which only the one with the highest id is relevant to query 3, its text's
  first words), queries.jsonl (12: query 10 with only grade-0 qrels, query 11 with none),
  qrels/test.tsv with grades 0 to 2. Returns the copies' ids."""
  rng = np.random.default_rng(0)
  os.makedirs(os.path.join(directory, "qrels"), exist_ok=True)
  ids = [f"doc{i}" for i in rng.permutation(40)]
  texts = [_words(rng, rng.integers(4, 14)) for _ in range(40)]
  copies = (3, 37, 39)
  for i in copies:
    texts[i] = texts[copies[0]]
  with open(os.path.join(directory, "corpus.jsonl"), "w", encoding="utf-8") as f:
    for i, (key, text) in enumerate(zip(ids, texts)):
      title = _words(rng, 2) if i % 3 == 1 and i not in copies else ""
      f.write(json.dumps({"_id": key, "title": title, "text": text}) + "\n")
  qrels, queries = {}, []
  for q in range(12):
    relevant = rng.choice(40, size=rng.integers(1, 6), replace=False)
    queries.append(" ".join(texts[relevant[0]].split()[:3]) + " " + _words(rng, 1))
    if q < 10:
      qrels[f"q{q}"] = {ids[d]: int(rng.integers(0, 3)) for d in relevant}
      qrels[f"q{q}"][ids[relevant[0]]] = 2
  queries[3] = " ".join(texts[copies[0]].split()[:3])
  copy_ids = sorted(ids[i] for i in copies)
  qrels["q3"] = {copy_ids[-1]: 2, ids[0]: 1}
  qrels["q10"] = {ids[5]: 0}
  with open(os.path.join(directory, "queries.jsonl"), "w", encoding="utf-8") as f:
    f.writelines(json.dumps({"_id": f"q{q}", "text": t}) + "\n" for q, t in enumerate(queries))
  with open(os.path.join(directory, "qrels", "test.tsv"), "w", encoding="utf-8") as f:
    f.write("query-id\tcorpus-id\tscore\n")
    f.writelines(f"{q}\t{d}\t{g}\n" for q, docs in qrels.items() for d, g in docs.items())
  return copy_ids


def write_sts(path, n=48, header=True):
  """An STS file of `n` scored pairs (GLUE STS-B's columns, or three without a header); the
  scores repeat (ties), and a pair shares more words where its score is higher."""
  rng = np.random.default_rng(1)
  rows = []
  for i in range(n):
    a = _words(rng, 8).split()
    score = float(i % 6)
    b = a[:int(score) + 1] + _words(rng, 7 - int(score)).split()
    rows.append((" ".join(a), " ".join(b), f"{score:.3f}"))
  with open(path, "w", encoding="utf-8") as f:
    if header:
      f.write("index\tgenre\tsentence1\tsentence2\tscore\n")
      f.writelines(f"{i}\tmain\t{a}\t{b}\t{s}\n" for i, (a, b, s) in enumerate(rows))
    else:
      f.writelines(f"{a}\t{b}\t{s}\n" for a, b, s in rows)
  return rows


def _their_retrieval(directory, st_model, embeddings=None):
  """sentence-transformers' InformationRetrievalEvaluator's metrics on BEIR `directory` (title
  + " " + text, qrels above 0), as {"ndcg_at_10": ...}: of `st_model`'s embeddings, or of
  `embeddings` ({"query": [q, d], "document": [c, d]} in eval_files' order)."""
  from sentence_transformers.sentence_transformer.evaluation import (  # pylint: disable=import-outside-toplevel
      InformationRetrievalEvaluator)
  from sentence_transformers.util import cos_sim  # pylint: disable=import-outside-toplevel
  data = eval_files.read_beir(directory)
  relevant = {data.query_ids[q]: {data.document_ids[d] for d, g in docs.items() if g > 0}
              for q, docs in data.qrels.items()}
  # The corpus in file order (eval_files orders it by id, for sentence-transformers' ties).
  with open(os.path.join(directory, "corpus.jsonl"), encoding="utf-8") as f:
    corpus = {d["_id"]: (d["title"] + " " + d["text"]).strip() for d in map(json.loads, f)}

  class Given(InformationRetrievalEvaluator):
    def embed_inputs(self, model, sentences, encode_fn_name=None, **kwargs):
      if embeddings is None:
        return super().embed_inputs(model, sentences, encode_fn_name, **kwargs)
      by_id = dict(zip(data.query_ids, embeddings["query"]))
      return torch.tensor(np.stack([by_id[q] for q in self.queries_ids]))

  evaluator = Given(dict(zip(data.query_ids, data.queries)), corpus, relevant, mrr_at_k=KS,
                    ndcg_at_k=KS, accuracy_at_k=KS, precision_recall_at_k=KS, map_at_k=KS,
                    score_functions={"cosine": cos_sim})
  given = None
  if embeddings is not None:
    by_id = dict(zip(data.document_ids, embeddings["document"]))
    given = torch.tensor(np.stack([by_id[d] for d in corpus]))
  scores = evaluator.compute_all_metrics(st_model, corpus_embeddings=given)["cosine"]
  return {f"{ST_NAMES[name]}_at_{k}": v for name, values in scores.items()
          for k, v in values.items()}


def test_retrieval_equals_sentence_transformers(model, tmp_path, capsys):
  """Every metric at k = 1, 3, 5, 10, 100 equals InformationRetrievalEvaluator's (1e-6): on the
  same embeddings (ties included: three copies of one document), ranked in chunks or not; and
  from the directory, the command against the evaluator on SentenceTransformer's embeddings
  (the "query" prompt on the queries, "document" on the documents)."""
  st_dir, st_model = model
  copies = write_beir(str(tmp_path / "beir"))
  data = eval_files.read_beir(str(tmp_path / "beir"))
  assert len(data.queries) == 10 and len(data.documents) == 40
  assert data.document_ids == sorted(data.document_ids)
  ours = embedder.Embedder.load(st_dir)
  queries = ours.encode(data.queries, prompt_name="query")
  documents = ours.encode(data.documents, prompt_name="document")
  for copy in copies[1:]:  # the same text: tied exactly
    documents[data.document_ids.index(copy)] = documents[data.document_ids.index(copies[0])]
  mine = evaluation.retrieval(queries, documents, data.qrels, KS)
  assert mine == evaluation.retrieval(queries, documents, data.qrels, KS, corpus_chunk_size=3)
  theirs = _their_retrieval(str(tmp_path / "beir"), None, {"query": queries,
                                                           "document": documents})
  assert set(theirs) == set(mine) - {"queries"} and mine["queries"] == 10
  difference = max(abs(mine[k] - theirs[k]) for k in theirs)
  assert difference <= 1e-6, difference
  assert 0 < mine["ndcg_at_10"] < 1 and mine["recall_at_100"] == 1.0
  assert evaluate.main([f"--model={st_dir}", f"--retrieval={tmp_path}/beir",
                        f"--output={tmp_path}/r.json"]) == 0
  line = json.loads(capsys.readouterr().out)
  assert line == json.loads((tmp_path / "r.json").read_text())
  assert (line["evaluation"], line["queries"], line["documents"]) == ("retrieval", 10, 40)
  theirs = _their_retrieval(str(tmp_path / "beir"), st_model)
  difference = max(abs(line[k] - theirs[k]) for k in theirs)
  assert difference <= 1e-6, difference


def test_sts_equals_sentence_transformers(model, tmp_path, capsys):
  """--sts on a GLUE STS-B-style file (and on the same pairs without a header) gives
  EmbeddingSimilarityEvaluator's spearman_cosine and pearson_cosine (1e-6); the library's
  correlations are scipy's on the same embeddings (tied gold scores)."""
  from scipy import stats  # pylint: disable=import-outside-toplevel
  from sentence_transformers.sentence_transformer.evaluation import (  # pylint: disable=import-outside-toplevel
      EmbeddingSimilarityEvaluator)
  st_dir, st_model = model
  rows = write_sts(tmp_path / "sts.tsv")
  write_sts(tmp_path / "plain.tsv", header=False)
  a, b, scores = eval_files.read_sts(str(tmp_path / "sts.tsv"))
  assert (a, b, scores) == eval_files.read_sts(str(tmp_path / "plain.tsv"))
  assert len(scores) == len(rows) == 48
  theirs = EmbeddingSimilarityEvaluator(a, b, scores)(st_model)
  lines = []
  for name in ("sts.tsv", "plain.tsv"):
    assert evaluate.main([f"--model={st_dir}", f"--sts={tmp_path}/{name}"]) == 0
    lines.append(json.loads(capsys.readouterr().out))
  for key in ("spearman_cosine", "pearson_cosine"):
    assert abs(lines[0][key] - theirs[key]) <= 1e-6, (key, lines[0][key], theirs[key])
    assert lines[1][key] == lines[0][key]
  ours = embedder.Embedder.load(st_dir)
  ea, eb = ours.encode(a), ours.encode(b)
  cosine = np.sum(ea * eb, -1) / np.linalg.norm(ea, axis=-1) / np.linalg.norm(eb, axis=-1)
  mine = evaluation.sts(ea, eb, scores)
  assert abs(mine["spearman_cosine"] - stats.spearmanr(scores, cosine)[0]) <= 1e-6
  assert abs(mine["pearson_cosine"] - stats.pearsonr(scores, cosine)[0]) <= 1e-6


def _senteval(x, y, folds, seed):
  """SentEval's InnerKFoldClassifier.run (usepytorch=False), as written there, on scikit-learn,
  its solver run to convergence: (fold accuracies, chosen C, dev scores)."""
  from sklearn.linear_model import LogisticRegression  # pylint: disable=import-outside-toplevel
  from sklearn.model_selection import StratifiedKFold  # pylint: disable=import-outside-toplevel
  regs = [2**t for t in range(-2, 4, 1)]
  skf = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
  innerskf = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
  accuracies, chosen, dev = [], [], []
  for train_idx, test_idx in skf.split(x, y):
    x_train, x_test, y_train, y_test = x[train_idx], x[test_idx], y[train_idx], y[test_idx]
    scores = []
    for reg in regs:
      regscores = []
      for inner_train, inner_test in innerskf.split(x_train, y_train):
        clf = LogisticRegression(C=reg, tol=1e-10, max_iter=10000)
        clf.fit(x_train[inner_train], y_train[inner_train])
        regscores.append(clf.score(x_train[inner_test], y_train[inner_test]))
      scores.append(round(100 * np.mean(regscores), 2))
    optreg = regs[np.argmax(scores)]
    dev.append(np.max(scores))
    clf = LogisticRegression(C=optreg, tol=1e-10, max_iter=10000).fit(x_train, y_train)
    accuracies.append(clf.score(x_test, y_test))
    chosen.append(optreg)
  return accuracies, chosen, dev


def test_transfer_is_senteval_on_scikit_learn(model, tmp_path, capsys):
  """The logistic regression is scikit-learn's (probabilities to 1e-6, two classes and three);
  the folds are StratifiedKFold's; SentEval's protocol on the model's embeddings of a labelled
  TSV chooses the same C and gets the same accuracy in each fold; --transfer=FILE reports it."""
  from sklearn.linear_model import LogisticRegression  # pylint: disable=import-outside-toplevel
  from sklearn.model_selection import StratifiedKFold  # pylint: disable=import-outside-toplevel
  st_dir, _ = model
  rng = np.random.default_rng(2)
  x = rng.normal(size=(90, 12))
  for classes in (2, 3):
    y = (x @ rng.normal(size=(12, classes)) + rng.normal(size=(90, classes))).argmax(1)
    for c in (0.25, 2.0, 8.0):
      theirs = LogisticRegression(C=c, tol=1e-12, max_iter=100000).fit(x, y)
      ours = evaluation.fit_logistic(x, y, c)
      difference = np.abs(ours.probabilities(x) - theirs.predict_proba(x)).max()
      assert difference <= 1e-6, (classes, c, difference)
      assert (ours.predict(x) == theirs.predict(x)).all()
    for folds in (3, 10):
      expected = np.empty(90, np.int64)
      for i, (_, test) in enumerate(StratifiedKFold(folds, shuffle=True,
                                                    random_state=5).split(x, y)):
        expected[test] = i
      np.testing.assert_array_equal(evaluation.stratified_folds(y, folds, 5), expected)
  # The protocol, on embeddings: label 1 where a text holds w10..w19.
  texts = [_words(rng, rng.integers(3, 9)) for _ in range(100)]
  labels = [int(any(w in WORDS[10:20] for w in t.split())) for t in texts]
  (tmp_path / "labelled.tsv").write_text("".join(f"{y}\t{t}\n" for t, y in zip(texts, labels)))
  texts, labels = eval_files.read_transfer(str(tmp_path / "labelled.tsv"))
  assert [len(t.split()) for t in texts] == sorted(len(t.split()) for t in texts)
  vectors = embedder.Embedder.load(st_dir).encode(texts)
  mine = evaluation.transfer(vectors, labels, folds=4)
  accuracies, chosen, dev = _senteval(vectors.astype(np.float64), np.asarray(labels), 4, 1111)
  assert mine["c"] == chosen
  np.testing.assert_allclose(mine["fold_accuracies"], accuracies, atol=1e-12)
  np.testing.assert_allclose(mine["dev_accuracy"] * 100, np.mean(dev), atol=1e-9)
  assert evaluate.main([f"--model={st_dir}", f"--transfer={tmp_path}/labelled.tsv",
                        "--folds=4"]) == 0
  line = json.loads(capsys.readouterr().out)
  assert (line["examples"], line["folds"], line["c"]) == (100, 4, chosen)
  assert abs(line["accuracy"] - np.mean(accuracies)) <= 1e-12


def test_the_docs_commands_run_as_written(model, tmp_path, monkeypatch, capsys):
  """docs/embeddings.md's "Evaluate" commands, as written, in a directory holding ST_DIR,
  BEIR_DIR (write_beir's) and STS-B/dev.tsv (write_sts'): each prints its JSON line; MR runs on
  the bundled movie reviews (10,568 sentences, 10 folds)."""
  monkeypatch.chdir(tmp_path)
  os.symlink(model[0], "ST_DIR")
  write_beir("BEIR_DIR")
  os.mkdir("STS-B")
  write_sts("STS-B/dev.tsv")
  commands = docs_text.bash_commands(docs_text.section("Evaluate"))
  assert len(commands) == 3
  results = []
  for command in commands:
    args = shlex.split(command)
    assert args[:3] == ["python", "-m", "bertjax.embedding.evaluate"], command
    assert evaluate.main(args[3:]) == 0, (command, capsys.readouterr().err)
    results.append(json.loads(capsys.readouterr().out))
  assert [r["evaluation"] for r in results] == ["retrieval", "sts", "transfer"]
  assert json.loads(open("retrieval.json", encoding="utf-8").read()) == results[0]
  assert (results[2]["examples"], results[2]["folds"]) == (10568, 10)


def test_bad_input_is_one_line(model, tmp_path, capsys):
  """Each refused input: one line naming the problem and the fix, exit 2; an existing --output
  untouched."""
  st_dir, _ = model
  beir = tmp_path / "beir"
  write_beir(str(beir))
  qrels = (beir / "qrels" / "test.tsv").read_text()

  def variant(name, **files):
    """A copy of `beir` with `files` ({relative path: text, or None: removed}) changed."""
    directory = tmp_path / name
    for path in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv"):
      (directory / path).parent.mkdir(parents=True, exist_ok=True)
      text = files.get(path.replace("/", "_").replace(".", "_"), (beir / path).read_text())
      if text is not None:
        (directory / path).write_text(text)
    return f"--retrieval={directory}"

  corpus = (beir / "corpus.jsonl").read_text().splitlines()
  write_sts(tmp_path / "sts.tsv")
  sts = (tmp_path / "sts.tsv").read_text().splitlines()
  (tmp_path / "sts_cols.tsv").write_text("\n".join(sts[:5] + ["a\tb\t1.0"]) + "\n")
  (tmp_path / "sts_score.tsv").write_text("\n".join(sts[:3] + ["3\tm\tw10 w11\tw12\thigh"]) + "\n")
  (tmp_path / "sts_empty.tsv").write_text("w10 w11\t \t1.0\nw12\tw13\t2.0\n")
  (tmp_path / "sts_test.tsv").write_text("index\tsentence1\tsentence2\n0\tw10\tw11\n")
  (tmp_path / "few.tsv").write_text("".join(f"{i % 2}\tw1{i}\n" for i in range(8)))
  (tmp_path / "labels.tsv").write_text("1\tw10 w11\nyes\tw12\n")
  (tmp_path / "cols.tsv").write_text("1\tw10 w11\n0\tw12\tw13\n")
  (tmp_path / "kept.json").write_text("mine")
  model_flag = f"--model={st_dir}"
  cases = [
      ([model_flag], "give one of --retrieval=BEIR_DIR, --sts=FILE and --transfer=mr|FILE."),
      ([model_flag, "--sts=x", "--transfer=mr"], "not --sts and --transfer"),
      ([model_flag, f"--retrieval={tmp_path}/none"], "is not a directory; give a BEIR directory"),
      ([model_flag, variant("a", corpus_jsonl=None)], "corpus.jsonl is not a file"),
      ([model_flag, f"--retrieval={beir}", "--split=dev"],
       "give --split= one of the splits there (test)"),
      ([model_flag, variant("b", qrels_test_tsv=qrels + "q1\tdoc99\t1\n")],
       "'doc99' is not an _id of corpus.jsonl"),
      ([model_flag, variant("c", qrels_test_tsv=qrels + "q99\tdoc1\t1\n")],
       "'q99' is not an _id of queries.jsonl"),
      ([model_flag, variant("d", qrels_test_tsv=qrels + "q1\tdoc1\n")],
       "has 2 tab-separated fields, not 3 (query-id, corpus-id, score)"),
      ([model_flag, variant("e", qrels_test_tsv=qrels + "q1\tdoc1\thigh\n")],
       "score 'high' is not a whole number"),
      ([model_flag, variant("f", corpus_jsonl="\n".join(corpus[:-1] + [
          json.dumps({"_id": json.loads(corpus[-1])["_id"], "title": "", "text": " "})]))],
       "has no text; give it some, or remove it and its qrels"),
      ([model_flag, variant("g", corpus_jsonl="\n".join(corpus + ["{\"text\": 1}"]))],
       "line 41 is not a JSON object with an \"_id\" and a text field"),
      ([model_flag, variant("h", corpus_jsonl="\n".join(corpus + corpus[:1]))],
       "is there twice; give each line its own _id"),
      ([model_flag, variant("i", qrels_test_tsv="query-id\tcorpus-id\tscore\nq1\tdoc1\t0\n")],
       "gives no query a relevant document"),
      ([model_flag, f"--sts={tmp_path}/none.tsv"], "none.tsv is not a file"),
      ([model_flag, f"--sts={tmp_path}/sts_cols.tsv"],
       "line 6 has 3 tab-separated fields, not 5"),
      ([model_flag, f"--sts={tmp_path}/sts_score.tsv"], "line 4: score 'high' is not a number"),
      ([model_flag, f"--sts={tmp_path}/sts_empty.tsv"], "line 1 has an empty text"),
      ([model_flag, f"--sts={tmp_path}/sts_test.tsv"], "has no score column"),
      ([model_flag, f"--transfer={tmp_path}/labels.tsv"],
       "neither column is whole-number labels on every line"),
      ([model_flag, f"--transfer={tmp_path}/cols.tsv"], "line 2 has 3 tab-separated fields, not 2"),
      ([model_flag, f"--transfer={tmp_path}/few.tsv"],
       "2 x folds examples of each class"),
      ([model_flag, "--sts=x", "--query_prompt=q: "], "--query_prompt is for --retrieval"),
      ([model_flag, "--sts=x", "--folds=3"], "--folds is for --transfer"),
      ([model_flag, "--sts=x", "--split=dev"], "--split is for --retrieval"),
      ([model_flag, "--sts=x", "--normalize"], "--normalize goes with --pooling"),
      ([model_flag, "--sts=x", "--output=out.txt"], "name a .json file"),
      ([model_flag, "--sts=x", f"--output={tmp_path}/kept.json"], "exists; name a new file"),
      ([f"--model={tmp_path}/nowhere", f"--sts={tmp_path}/sts.tsv"], "is not a directory"),
  ]
  capsys.readouterr()
  for args, message in cases:
    assert evaluate.main(args) == 2, args
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, (args, err)
  assert (tmp_path / "kept.json").read_text() == "mine"
