"""One small registry for every name -> thing table (modes, strategies, cost rules, models, ...).

A :class:`Registry` is a read-only mapping that refuses a second entry under a name it holds
(a programming error, raised at import) and turns an unknown name into the one-line user error
``unknown <what> 'x'; choose one of: a, b, c``. A registry whose names must be known before it is
imported (help texts, defaults) is bound to their tuple in :mod:`memplan.names` and refuses any
other name.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from importlib import import_module
from typing import Any, Generic, TypeVar

from .errors import BadOption, MemplanError

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """Names -> items, in registration order. ``what`` names an item in error messages;
    ``names``: the only names it takes (declared in :mod:`memplan.names`), None for any."""

    def __init__(self, what: str, error: type[MemplanError] = BadOption, names: Collection[str] | None = None):
        self.what = what
        self.error = error
        self.names = names
        self._items: dict[str, T] = {}

    def __getitem__(self, name: str) -> T:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def get(self, name: str, default: T | None = None) -> T | None:
        return self._items.get(name, default)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}: {', '.join(self._items)})"

    def add(self, name: str, item: T) -> T:
        """Register ``item`` under ``name``; returns it. A name registered twice is a ValueError."""
        if name in self._items:
            raise ValueError(f"{self.what} {name!r} is registered twice")
        if self.names is not None and name not in self.names:
            raise ValueError(f"{self.what} {name!r} is not declared in memplan.names")
        self._items[name] = item
        return item

    def register(self, *names: str) -> Callable[[T], T]:
        """Decorator: register the decorated object under every one of ``names``."""

        def decorate(item: T) -> T:
            for name in names:
                self.add(name, item)
            return item

        return decorate

    def choose(self, name: str) -> T:
        """The item named ``name``, or the one-line error listing the known names."""
        if name not in self._items:
            raise self.error(f"unknown {self.what} {name!r}", f"choose one of: {', '.join(self._items)}")
        return self._items[name]


def lazy_exports(package: str, exports: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A package's module ``__getattr__``: public name ``name`` of ``exports`` (name -> the module of
    ``package`` that defines it) imported on first use and kept in ``namespace`` (the package's
    globals), so importing the package imports none of its modules."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f"{package}.{exports[name]}"), name)
        namespace[name] = value
        return value

    return __getattr__
