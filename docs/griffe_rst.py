"""griffe extension: memplan's docstrings are reStructuredText-flavoured (``:func:`name```, double
backticks); mkdocstrings renders Markdown. Roles become code spans and double backticks single
ones, so the API reference reads as the docstrings do."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|obj|exc):`~?([^`]+)`")


class RstRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(r"`\1`", obj.docstring.value).replace("``", "`")
