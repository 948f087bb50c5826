"""The installed package's version: ``pyproject.toml`` is its one source (read from the package's metadata)."""

from importlib import metadata

try:
    VERSION = metadata.version("django-esdlock")
except metadata.PackageNotFoundError:  # a source tree that was never installed
    VERSION = "0+unknown"
