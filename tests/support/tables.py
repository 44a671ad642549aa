"""Where the tests expect a table to land by default: ``<lake>/<layer>/<table>``.

Written out here on purpose, apart from the catalog that derives it in the product: a test that
reads a table through this location also checks the catalog's default layout. The lake may be a
local folder or an ``s3a://`` prefix (``Settings.lake``): the result is a
:class:`~pipelines.location.Location` either way (``str()`` of it is what Spark is given).
"""

from pipelines.location import Location
from pipelines.settings import Settings


def lake_path(settings: Settings, layer: str, table: str) -> Location:
    """The default location of table ``table`` of layer ``bronze``, ``silver`` or ``gold``."""
    return settings.lake / layer / table


def silver_path(settings: Settings, table: str) -> Location:
    return lake_path(settings, "silver", table)


def gold_path(settings: Settings, table: str) -> Location:
    return lake_path(settings, "gold", table)
