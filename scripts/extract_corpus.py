"""Builds the bundled corpus: Jane Austen's six novels -> bertjax/data/corpus/austen.txt.

  cd /tmp && apt-get download r-cran-janeaustenr && dpkg-deb -x r-cran-janeaustenr*.deb /tmp/ja
  python scripts/extract_corpus.py --deb_dir=/tmp/ja

The Debian package r-cran-janeaustenr holds the novels (Project Gutenberg's texts, as packaged
by Julia Silge's janeaustenr) in R's lazy-load format: an index (Rdata.rdx) and a database
(Rdata.rdb) of serialized R objects, one character vector of lines per novel. This script reads
them with the `rdata` package (pip install rdata), cuts each novel into chapters (one document
each; the title page, front matter, "VOLUME"/"CHAPTER" headings and end matter are dropped),
joins wrapped lines into paragraphs, splits paragraphs into sentences with
`bertjax.data.sources.split_sentences`, and writes google-research/bert's format: one sentence
per line, a blank line between documents. The output depends only on the input.
"""
from __future__ import annotations

import argparse
import bz2
import glob
import gzip
import lzma
import os
import re
import sys
import warnings
import zlib

NOVELS = ("sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey",
          "persuasion")  # in order of publication (Northanger Abbey and Persuasion: 1817)
_CHAPTER = re.compile(r"^chapter\s+([ivxlc]+|\d+)\.?$", re.IGNORECASE)
_VOLUME = re.compile(r"^volume\s+([ivxlc]+|\d+)\.?$", re.IGNORECASE)
_END = re.compile(r"^(the end|finis|a note on the text)\.?$", re.IGNORECASE)
_SEPARATOR = re.compile(r"^[\s*.\-]+$")  # "* * * * *", "***": a scene break


def _decompress(data: bytes) -> bytes:
  """One compressed R object: zlib (R's default), gzip, bzip2 or xz, told by its magic bytes."""
  if data[:2] == b"\x1f\x8b":
    return gzip.decompress(data)
  if data[:3] == b"BZh":
    return bz2.decompress(data)
  if data[:6] == b"\xfd7zXZ\x00":
    return lzma.decompress(data)
  return zlib.decompress(data)


def _unwrap(data: bytes) -> bytes:
  """A compressed R serialization, with or without R's 4-byte length (+ type) header."""
  for skip in (0, 4, 5):  # whole file; length header; length + type byte ('2' bzip2, 'Z' xz)
    try:
      return _decompress(data[skip:])
    except (OSError, EOFError, zlib.error, lzma.LZMAError, ValueError):
      continue
  raise ValueError("not a compressed R object")


def read_novels(deb_dir: str) -> dict[str, list[str]]:
  """The novels' lines from the R data in an extracted r-cran-janeaustenr package.

  Args:
    deb_dir: the directory the .deb was extracted to (dpkg-deb -x).

  Returns:
    {novel name: [num_lines] str} for the names in NOVELS.
  """
  import rdata  # pylint: disable=import-outside-toplevel

  # rdata warns that each lazy-load object lacks an .rds file header; it has none by design.
  warnings.filterwarnings("ignore", message="Unknown file type", module="rdata")

  candidates = sorted(glob.glob(os.path.join(deb_dir, "**", "janeaustenr", "*", "*.rdx"),
                                recursive=True))
  parse = lambda data: rdata.conversion.convert(rdata.parser.parse_data(_unwrap(data)))  # noqa
  for rdx in candidates:
    with open(rdx, "rb") as f:
      index = parse(f.read())
    variables = {str(k): v for k, v in index["variables"].items()}
    if not set(NOVELS) <= set(variables):
      continue
    with open(rdx[:-1] + "b", "rb") as f:  # .rdx -> .rdb
      database = f.read()
    novels = {}
    for name in NOVELS:
      offset, length = (int(x) for x in variables[name])
      novels[name] = [str(line) for line in parse(database[offset:offset + length])]
    return novels
  sys.exit(f"extract_corpus: no janeaustenr R data with the novels under {deb_dir} (looked at "
           f"{candidates or 'no .rdx file'}); extract r-cran-janeaustenr there with dpkg-deb -x.")


def chapters(lines: list[str]) -> list[list[str]]:
  """A novel's lines -> its chapters, each a list of paragraphs (wrapped lines joined).

  Everything before the first chapter heading (title page, advertisement) and from an end
  marker (THE END, FINIS, a closing note) on is dropped, as are headings and scene breaks.
  Italics marks (_word_) are removed.
  """
  result, paragraph = [], []
  for raw in lines + [""]:
    line = raw.strip()
    if _END.match(line):
      line = "END"
    if not line or _CHAPTER.match(line) or _VOLUME.match(line) or line == "END" or (
        _SEPARATOR.match(line)):
      if paragraph and result:
        result[-1].append(" ".join(paragraph))
      paragraph = []
      if _CHAPTER.match(line):
        result.append([])
      if line == "END":
        break
      continue
    paragraph.append(line.replace("_", ""))
  return [chapter for chapter in result if chapter]


def corpus_text(novels: dict[str, list[str]]) -> tuple[str, dict[str, int]]:
  """The novels -> (the corpus file's text, counts of documents, sentences and bytes)."""
  from bertjax.data.sources import split_sentences  # pylint: disable=import-outside-toplevel

  documents = []
  for name in NOVELS:
    for chapter in chapters(novels[name]):
      sentences = [s for paragraph in chapter for s in split_sentences(paragraph)]
      if sentences:
        documents.append(sentences)
  text = "\n".join("".join(s + "\n" for s in sentences) for sentences in documents)
  counts = {"documents": len(documents), "sentences": sum(map(len, documents)),
            "bytes": len(text.encode("utf-8"))}
  return text, counts


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--deb_dir", required=True,
                      help="directory r-cran-janeaustenr was extracted to (dpkg-deb -x)")
  parser.add_argument("--output", default=os.path.join("bertjax", "data", "corpus",
                                                       "austen.txt"),
                      help="corpus file to write")
  args = parser.parse_args(argv)
  text, counts = corpus_text(read_novels(args.deb_dir))
  os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
  with open(args.output, "w", encoding="utf-8", newline="\n") as f:
    f.write(text)
  print(f"wrote {counts['documents']} documents, {counts['sentences']} sentences, "
        f"{counts['bytes']} bytes to {args.output}")
  return 0


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  sys.exit(main())
