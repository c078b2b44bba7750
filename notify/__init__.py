"""notify: a transactional messaging middleware in the line of Alibaba's Notify and MetaQ."""

from notify.version import __version__

__all__ = ["__version__"]
