"""Every fenced code block of README.md and of the docs site (docs/**/*.md) runs (docs/development.md,
"Code blocks in the README and the docs").

The collector reads each block's info string: the language (``bash`` / ``sh`` run as one shell
script with ``set -e``, ``memplan`` and ``python`` on PATH; ``python`` runs in a subprocess;
``text`` is output shown, never run: tests/test_readme_outputs.py compares the README's with the
real output), then flags: ``slow`` puts the block behind the slow marker; ``no-run`` skips it,
and its first line must be a comment saying why (visible in the rendered page). A block in any
other language, or with an unknown flag, fails. Blocks run in one scratch copy of the
repository's tracked files, file by file and in order within a file (the tutorial's later blocks
use what its earlier ones wrote), so a command writing ``search/...`` or ``layers.csv`` changes
nothing here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: the Markdown files whose blocks run: the README, then the docs site's pages
DOCUMENTS = [README, *sorted((ROOT / "docs").rglob("*.md"))]
OUTPUT = "text"  # a block showing a command's output: read, never run
RUNNERS = {
    "bash": ["bash", "-e", "-o", "pipefail", "-c"],
    "sh": ["bash", "-e", "-o", "pipefail", "-c"],
    "python": [sys.executable, "-c"],
}
FLAGS = ("slow", "no-run")
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
TIMEOUT = 600


@dataclass
class Block:
    line: int  # 1-based line of the opening fence
    language: str
    flags: list[str]
    code: str
    source: str = "README.md"  # the file, relative to the repository root

    @property
    def id(self) -> str:
        return f"{self.source}:{self.line}-{self.language or 'plain'}"


def read_blocks(text: str, source: str = "README.md") -> list[Block]:
    """The fenced blocks of a Markdown text (backtick or tilde fences, indented ones too)."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m["indent"], m["fence"], m["info"].strip().split()
        body, j = [], i + 1
        while j < len(lines) and not re.match(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[j]):
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        blocks.append(Block(i + 1, info[0] if info else "", info[1:], "\n".join(body) + "\n", source))
        i = j + 1
    return blocks


def _param(block: Block):
    marks = [pytest.mark.slow] if "slow" in block.flags else []
    if "no-run" in block.flags:
        marks.append(pytest.mark.skip(reason=f"no-run: {block.code.splitlines()[0] if block.code.strip() else ''}"))
    return pytest.param(block, id=block.id, marks=marks)


BLOCKS = [
    b for doc in DOCUMENTS for b in read_blocks(doc.read_text(encoding="utf-8"), doc.relative_to(ROOT).as_posix())
]
RUN = [b for b in BLOCKS if b.language != OUTPUT]


def test_every_block_is_runnable_or_says_why_not():
    assert any(b.source == "docs/tutorial.md" for b in RUN), "the tutorial's blocks are collected"
    for b in BLOCKS:
        if b.language == OUTPUT:
            assert not b.flags, f"{b.id}: an output block takes no flags"
            continue
        assert b.language in RUNNERS or "no-run" in b.flags, f"{b.id}: language {b.language!r} cannot run here"
        assert set(b.flags) <= set(FLAGS), f"{b.id}: unknown flags {set(b.flags) - set(FLAGS)}; use {FLAGS}"
        if "no-run" in b.flags:
            first = b.code.lstrip().splitlines()[0] if b.code.strip() else ""
            assert re.match(r"#\s*\S", first), f"{b.id}: a no-run block starts with a comment saying why"


def test_collector_reads_info_strings_and_indented_fences():
    text = "x\n```bash no-run\n# why\nrm -rf /\n```\n- item\n  ~~~python slow\n  print(1)\n  ~~~\n"
    first, second = read_blocks(text)
    assert (first.line, first.language, first.flags, first.code) == (2, "bash", ["no-run"], "# why\nrm -rf /\n")
    assert (second.language, second.flags, second.code) == ("python", ["slow"], "print(1)\n")


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    """A scratch copy of the repository's tracked files (links kept as links)."""
    dest = tmp_path_factory.mktemp("readme")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        src, dst = ROOT / name, dest / name
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the working tree
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst, follow_symlinks=False)
    return dest


@pytest.mark.parametrize("block", [_param(b) for b in RUN])
def test_readme_block_runs(block, workdir):
    env = {
        **os.environ,
        "MEMPLAN_NUM_THREADS": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    done = subprocess.run(
        [*RUNNERS[block.language], block.code], cwd=workdir, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert done.returncode == 0, (
        f"{block.id} exited {done.returncode}\n{block.code}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )


def test_ci_runs_exactly_the_readme_test_command():
    """.ci/run's command line is the Quick start's "Run the whole test suite" block, byte for byte."""
    text = README.read_text(encoding="utf-8")
    suite = text.split("Run the whole test suite:", 1)[1]
    command = next(b for b in read_blocks(suite)).code.strip().splitlines()[-1]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    assert command == ci and "pytest" in ci and "requirements-corpus.txt" in ci
