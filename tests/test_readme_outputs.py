"""The README's sample outputs are the real output: a ``bash`` block holding one ``memplan`` command
followed by a ``text`` block shows what that command prints, and this test runs the command (each
takes a few seconds) and compares, tolerating only what differs between runs and machines:

* whitespace: table columns and the console's line wrapping (runs of spaces and line breaks are one space);
* timings (``0.3 s``, ``12 ms``), hashes (12+ hex digits) and where a file lies (a path compares by
  its file name: ``memplan/data/profiles/x.json`` is ``/site-packages/memplan/data/profiles/x.json``);
* a line ``(... left out here)`` of the block stands for any part of the output (a table the
  README leaves out).

Every other number and word must be the same, so a README block goes stale only with a failing test.
The calibration cache is an empty folder (``kernel workspaces: missing``, on any machine).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from .test_readme import README, ROOT, read_blocks

#: a line of a shown output standing for any part of the real one
ELIDED = re.compile(r"(?m)^[ \t]*\(.*\bleft out here\)[ \t]*$")
TIMING = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?(?:ms|s|min)\b")
HASH = re.compile(r"\b[0-9a-f]{12,}\b")
PATH = re.compile(r"(?<![^\s(`'\"])(?:[\w.~+-]*/)+([\w+-][\w.+-]*\.\w+)")


def normalise(text: str) -> str:
    """``text`` with what may differ between runs replaced (module docstring), whitespace collapsed."""
    text = PATH.sub(r"<path>/\1", text)
    text = HASH.sub("<hash>", text)
    text = TIMING.sub("<time>", text)
    return " ".join(text.split())


def matches(shown: str, printed: str) -> bool:
    """Whether ``printed`` (the real output) is what ``shown`` (a text block) shows, up to :func:`normalise`
    and the block's elided parts."""
    parts = [normalise(p) for p in ELIDED.split(shown)]
    pattern = r"\s*.*?\s*".join(re.escape(p) for p in parts)
    return re.fullmatch(r"\s*" + pattern + r"\s*", normalise(printed), flags=re.DOTALL) is not None


def shown_outputs() -> list[tuple[int, list[str], str]]:
    """(line, the command's argv after ``memplan``, the text block) of each README command whose output is shown."""
    blocks = read_blocks(README.read_text(encoding="utf-8"))
    pairs = []
    for command, output in zip(blocks, blocks[1:], strict=False):
        lines = [line for line in command.code.splitlines() if line.strip()]
        if command.language == "bash" and output.language == "text" and len(lines) == 1:
            argv = shlex.split(lines[0])
            if argv[0] == "memplan" and not command.flags:
                pairs.append((output.line, argv[1:], output.code))
    return pairs


def test_the_readme_shows_outputs_of_commands():
    """The collector finds the README's shown outputs (profile and search)."""
    commands = [argv[0] for _, argv, _ in shown_outputs()]
    assert commands[:2] == ["profile", "search"], commands


def test_the_comparison_tolerates_only_timings_paths_hashes_and_elisions():
    shown = "done in 0.3 s · hash 0e40838418477d7b · profile memplan/data/x.json\n(tables left out here)\nlast line"
    printed = "done in 12.5 s   · hash 1111222233334444\n· profile /tmp/a/b/memplan/data/x.json\n| a | b |\nlast  line"
    assert matches(shown, printed)
    assert not matches(shown.replace("last", "first"), printed)  # a word
    assert not matches("params 3,504,872 · MACs 300.77M", "params 3,504,873 · MACs 300.77M")  # a number
    assert not matches("memory 1280 B", "memory 1280 B\nwarning: something new")  # a line the README lacks
    assert not matches("profile a/x.json", "profile a/y.json")  # another file


@pytest.mark.parametrize(
    "line, argv, shown", [pytest.param(*o, id=f"README.md:{o[0]}-{o[1][0]}") for o in shown_outputs()]
)
def test_readme_output_is_the_real_output(line, argv, shown, tmp_path):
    env = {**os.environ, "MEMPLAN_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MEMPLAN_CACHE": str(tmp_path / "cache")}
    env.pop("MEMPLAN_DEBUG", None)
    done = subprocess.run(
        [sys.executable, "-m", "memplan", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert matches(shown, done.stdout + done.stderr), (
        f"README.md:{line}: the output of `memplan {' '.join(argv)}` differs from the text block:\n"
        f"shown:   {normalise(shown)}\nprinted: {normalise(done.stdout + done.stderr)}"
    )
