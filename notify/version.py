"""The package version (also answered to the wire ``version`` command)."""

__version__ = "0.1.0"
