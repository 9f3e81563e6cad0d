"""The ``ilge-search`` command line: the group (:mod:`.group`) and its commands, one module per area."""

from . import data, results, studies, transfer, use  # noqa: F401  (each registers its commands on the group)
from .group import IlgeGroup, cli, location_options, main, storage_option

__all__ = ["cli", "main", "IlgeGroup", "location_options", "storage_option"]
