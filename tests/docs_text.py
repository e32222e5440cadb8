"""The README and the pages under docs/ (but docs/DESIGN.md, the map of the code): their text,
a section by its `## title`, and the command lines of their ```bash blocks, for the tests that
run or parse those commands as written."""
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pages() -> list[str]:
  """The user's pages, relative to the repository root: README.md, then docs/*.md."""
  docs = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
  return ["README.md"] + [p for p in docs if os.path.basename(p) != "DESIGN.md"]


def read(page: str) -> str:
  with open(os.path.join(ROOT, page), encoding="utf-8") as f:
    return f.read()


def all_text() -> str:
  """Every page's text, one after another."""
  return "\n".join(read(page) for page in pages())


def section(title: str) -> str:
  """The section `## title` (its ### subsections included) of the one page that has it."""
  found = [read(page).split(f"\n## {title}\n")[1].split("\n## ")[0] for page in pages()
           if f"\n## {title}\n" in read(page)]
  assert len(found) == 1, (title, len(found))
  return found[0]


def bash_commands(text: str) -> list[str]:
  """Each command line of the ```bash blocks of `text`, backslash-continued lines joined and
  stripped of indentation."""
  return [line.strip() for block in re.findall(r"```bash\n(.*?)```", text, re.S)
          for line in re.sub(r"\\\n\s*", " ", block).splitlines() if line.strip()]
