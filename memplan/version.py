"""The memplan version (one definition: the package, provenance records and the CLI read it)."""

__version__ = "0.1.0"
