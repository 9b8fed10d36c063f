"""User-facing errors: each carries a one-line message and the CLI exit code."""

from __future__ import annotations


class MemplanError(Exception):
    """An error caused by the user's input; the CLI prints ``error: <message>`` and exits."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None):
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message} ({hint})")

    def __str__(self) -> str:  # one line, always
        text = self.message if self.hint is None else f"{self.message}; {self.hint}"
        return " ".join(text.split())


class ModelNotFound(MemplanError):
    """Unknown zoo name or an import path that does not resolve."""


class TraceFailure(MemplanError):
    """torch.fx could not trace the model."""


class InputShapeError(MemplanError):
    """The model fails on the input shape it is traced at (a wrong channel count or size)."""


class BadOption(MemplanError):
    """An option value that cannot be used (negative batch, unknown method, ...)."""


class SchemeError(MemplanError):
    """A scheme that cannot be read, or does not fit the model."""


class AssumptionWarning(UserWarning):
    """memplan assumed what the input did not say (e.g. a model's input shape); the command line
    prints it as one line ``warning: ...``."""
