"""The Amplifier module ``hooks-leasehold``: one owner per session.

Mount plan::

    hooks:
      - module: hooks-leasehold
        config: {address: "127.0.0.1:7420"}

The module itself lives in :mod:`leasehold.amplifier`; this package is the
name Amplifier's loader looks for (``amplifier_module_<id>``, and the
``amplifier.modules`` entry point ``hooks-leasehold``).
"""

from leasehold.amplifier import mount

# Amplifier module metadata: the loader derives the mount point from it.
__amplifier_module_type__ = "hook"

__all__ = ["mount"]
