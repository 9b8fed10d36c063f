"""mkdocs hook: the command-line reference, generated from the typer application at build time.

A page holding the marker ``<!-- memplan-cli -->`` gets, in its place, typer's own Markdown docs
of ``memplan`` (every command, argument and option with its help and default: what
``typer memplan.cli utils docs`` prints), built in process so that a failure fails the build.
"""

from __future__ import annotations

from typing import Any

MARKER = "<!-- memplan-cli -->"


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    if MARKER not in markdown:
        return markdown
    import click
    import typer
    from typer.cli import get_docs_for_click

    from memplan.cli import app

    command = typer.main.get_command(app)
    with click.Context(command, info_name="memplan") as ctx:
        docs = get_docs_for_click(obj=command, ctx=ctx, name="memplan", title="memplan")
    # one level down: the page has its own title
    docs = "\n".join("#" + line if line.startswith("#") else line for line in docs.splitlines())
    return markdown.replace(MARKER, docs)
