"""The package version reported by the Info RPC."""

from importlib import metadata

try:
    __version__ = metadata.version("ivy-tulip-rose")
except metadata.PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0"
