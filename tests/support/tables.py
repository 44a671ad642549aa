"""Where the tests expect a table to land by default: ``<lake>/<layer>/<table>``.

Written out here on purpose, apart from the catalog that derives it in the product: a test that
reads a table through this path also checks the catalog's default layout.
"""

from pathlib import Path

from pipelines.settings import Settings


def lake_path(settings: Settings, layer: str, table: str) -> Path:
    """The default location of table ``table`` of layer ``bronze``, ``silver`` or ``gold``."""
    return settings.lake_dir / layer / table


def silver_path(settings: Settings, table: str) -> Path:
    return lake_path(settings, "silver", table)


def gold_path(settings: Settings, table: str) -> Path:
    return lake_path(settings, "gold", table)
