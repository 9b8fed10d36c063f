"""The memplan version (one definition, read by the package and by scheme provenance records)."""

__version__ = "0.1.0"
