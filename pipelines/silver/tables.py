"""The table properties by which a silver table records the parts of the spec its content
depends on (checked at every start by :func:`pipelines.catalog.lifecycle.check_table`)."""

FORMAT_PROPERTY = "conflux.silver.format"
KEYS_PROPERTY = "conflux.silver.keys"
SEQUENCE_PROPERTY = "conflux.silver.sequenceBy"
CHAINING_PROPERTY = "conflux.silver.chaining"
#: A history table's tracked columns (and whether null updates are ignored): other versions.
HISTORY_PROPERTY = "conflux.silver.trackHistory"
