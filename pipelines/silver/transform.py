"""The custom transform hook: a user's ``DataFrame -> DataFrame`` between parsing and writing.

``silver.transform: package.module:function`` names it. The module is looked up first in the
folder of the flow's spec (so ``flows/customers_transforms.py`` is ``customers_transforms``), then
on ``sys.path``; a module found beside the spec is also shipped to the executors
(``SparkContext.addPyFile``), so UDFs in it work on a cluster.

The function gets each batch's parsed events (the schema's columns, then the ``_`` metadata
columns of :data:`pipelines.silver.parse.EVENT_METADATA`) and returns the rows to write. It may add
columns (they reach the events, current and history tables), drop columns no table needs, and
filter or rewrite rows; it must keep every metadata column with its type and the key columns.
:func:`checked_row_schema` checks that at start, on an empty batch, so a transform that would
change the tables incompatibly is refused before anything runs (and the tables' own checks refuse
a change of an existing table's schema). An exception inside it, at start or in any batch, fails
the flow with :class:`TransformError` naming the function, the flow and the batch.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import ModuleType

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from pipelines.errors import ConfigError
from pipelines.held import hold, release

Transform = Callable[[DataFrame], DataFrame]


class TransformError(RuntimeError):
    """The spec's transform raised, or returned something that is not a DataFrame."""


def _module_beside(name: str, folder: Path) -> Path | None:
    candidate = folder.joinpath(*name.split(".")).with_suffix(".py")
    return candidate if candidate.is_file() else None


def load_transform(reference: str, spec_file: str, spark: SparkSession | None = None) -> Transform:
    """Import ``module:function`` (see the module doc); misconfigurations name the fix."""
    module_name, _, function_name = reference.partition(":")
    where = f"{spec_file}: silver.transform"
    folder = Path(spec_file).parent
    beside = _module_beside(module_name, folder) if Path(spec_file).exists() else None
    try:
        module: ModuleType
        if beside is not None:
            module = _import_file(module_name, beside)
            if spark is not None:
                spark.sparkContext.addPyFile(str(beside))
        else:
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"{where}: cannot import module {module_name!r} ({exc}); put it beside the spec "
            f"({folder}/{module_name.replace('.', '/')}.py) or install it in the environment"
        ) from exc
    function = getattr(module, function_name, None)
    if function is None or not callable(function):
        raise ConfigError(
            f"{where}: module {module_name!r} ({module.__file__}) has no function "
            f"{function_name!r}; define `def {function_name}(events: DataFrame) -> DataFrame`"
        )
    return function


def _import_file(name: str, path: Path) -> ModuleType:
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"not a Python module: {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def apply_transform(
    transform: Transform,
    reference: str,
    events: DataFrame,
    flow: str,
    batch_id: int | str,
    columns: Sequence[str] | None = None,
) -> DataFrame:
    """``transform(events)`` (then ``columns`` of it), its failure named: analysis errors, and a
    column the start-up check found but this batch's output lacks, surface here, on the call."""
    try:
        result = transform(events)
        if not isinstance(result, DataFrame):
            raise TypeError(f"it returned {type(result).__name__}; it must return a DataFrame")
        return result if columns is None else result.select(*columns)
    except Exception as exc:
        raise TransformError(_failed(reference, flow, batch_id, exc)) from exc


def _failed(reference: str, flow: str, batch_id: int | str, exc: BaseException) -> str:
    return (
        f"silver.transform {reference} failed in flow {flow}, batch {batch_id}: "
        f"{type(exc).__name__}: {_cause(exc)}"
    )


def _cause(exc: BaseException) -> str:
    """The line that says what went wrong: for an error raised in a Python worker (a UDF), the
    worker's own ``SomeError: message`` line rather than Spark's "An exception was thrown"."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    raised = [line for line in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception): ", line)]
    return (raised or lines or [""])[-1 if raised else 0]


def materialize(
    transformed: DataFrame, reference: str, flow: str, batch_id: int
) -> tuple[DataFrame, int]:
    """Compute the transformed events once and hold them (:func:`pipelines.held.hold`), with
    their count, so that an error inside the function (a UDF raising on a row) fails here, named,
    and not in the middle of the table writes, and no write runs the function again."""
    try:
        held = hold(transformed)
    except Exception as exc:
        raise TransformError(_failed(reference, flow, batch_id, exc)) from exc
    try:
        return held, held.count()
    except Exception:
        release(held)
        raise


def checked_row_schema(
    output: StructType,
    events: StructType,
    metadata: Iterable[str],
    required: Iterable[tuple[str, str]],
    where: str,
) -> StructType:
    """The row columns (output minus metadata, in output order) of a transform's output.

    ``events`` is the schema the transform was given, ``required`` (column, spec field) pairs of
    columns a table needs. Raises ConfigError naming what the transform broke.
    """
    have = {f.name: f for f in output.fields}
    given = {f.name: f for f in events.fields}
    metadata = tuple(metadata)
    problems = [f"it dropped metadata column {name}" for name in metadata if name not in have]
    problems += [
        f"it changed {name} from {given[name].dataType.simpleString()} to "
        f"{have[name].dataType.simpleString()}"
        for name in metadata
        if name in have and have[name].dataType != given[name].dataType
    ]
    for column, field in required:
        if column not in have:
            problems.append(f"it dropped column {column}, which {field} names")
        elif column in given and have[column].dataType != given[column].dataType:
            problems.append(
                f"it changed {column} ({field}) from {given[column].dataType.simpleString()} to "
                f"{have[column].dataType.simpleString()}"
            )
    if problems:
        raise ConfigError(
            f"{where}: the transform's output does not fit the silver tables: "
            f"{'; '.join(problems)}. Keep those columns (add new ones beside them)."
        )
    return StructType([f for f in output.fields if f.name not in metadata])
