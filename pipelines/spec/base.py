"""The base of every spec model, and the error a spec raises.

Every model is frozen and refuses unknown YAML keys, naming the allowed ones. Validators raise
:func:`_error` so the message is ours and carries the field it is about (relative to the failing
model); :mod:`.errors` turns it into ``file: dotted.field: message`` of a :class:`SpecError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError

from pipelines.errors import ConfigError


@dataclass(frozen=True)
class SpecProblem:
    """One problem of a spec file: the file, and the line that names it and the fix
    (``flows/orders.yaml: silver.current.keys: ...``)."""

    file: str
    line: str

    def __str__(self) -> str:
        return self.line


class SpecError(ConfigError):
    """A flow spec is invalid; the message names the file and the field.

    The message is the first problem found, so a command stops at it; :attr:`problems` holds
    every problem found (``conflux validate`` lists them all).
    """

    def __init__(self, message: str, problems: Sequence[SpecProblem] = ()) -> None:
        super().__init__(message)
        self.problems = tuple(problems)

    @classmethod
    def of(cls, problems: Sequence[SpecProblem]) -> SpecError:
        """The error of ``problems`` (at least one): the first is its message."""
        return cls(problems[0].line, problems)


def _error(message: str, field: str = "") -> PydanticCustomError:
    """A validation error carrying our own wording; ``field`` is relative to the failing model."""
    return PydanticCustomError("conflux_spec", "{message}", {"message": message, "field": field})


def _raise_all(errors: Iterable[PydanticCustomError], model: str) -> None:
    """Raise every one of ``errors`` (a validator's :func:`_error` s) at once, so a spec with
    several problems shows them all; nothing when there are none. Pydantic takes the line errors
    of a :class:`ValidationError` raised in a validator as the validator's own."""
    found = list(errors)
    if len(found) == 1:
        raise found[0]
    if found:
        raise ValidationError.from_exception_data(
            model, [InitErrorDetails(type=error, loc=(), input=None) for error in found]
        )


@dataclass(frozen=True)
class UnknownKey:
    """The value of a YAML key its model does not know, in place of the key's own: pydantic
    refuses the key (``extra_forbidden``) and goes on to validate the other keys, so a typo hides
    no other problem; :mod:`.errors` names the keys the model allows."""

    allowed: tuple[str, ...]


class _Model(BaseModel):
    """Frozen; unknown YAML keys are refused with the allowed ones; ``key: null`` is absent."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        validate_by_name=True,
        validate_by_alias=True,
        validate_default=False,
    )
    #: Fields that are not YAML keys (set by the loader).
    _internal_fields: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def yaml_keys(cls) -> list[str]:
        """The keys a YAML mapping may use for this model, in declaration order."""
        return [
            field.validation_alias if isinstance(field.validation_alias, str) else name
            for name, field in cls.model_fields.items()
            if name not in cls._internal_fields
        ]

    @model_validator(mode="before")
    @classmethod
    def _check_keys(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict):
            return data
        keys = cls.yaml_keys()
        from_yaml = bool(info.context and info.context.get("yaml"))
        allowed = set(keys) if from_yaml else set(keys) | set(cls.model_fields)
        unknown = [key for key in data if key not in allowed]
        # A field's own name where YAML spells it otherwise (``schema_ddl``) would be taken:
        # refuse it here. Any other unknown key stands in for itself (see UnknownKey).
        taken = sorted(
            str(key) for key in unknown if not isinstance(key, str) or key in cls.model_fields
        )
        _raise_all(
            (_error(f"unknown field; allowed: {', '.join(keys)}", key) for key in taken),
            cls.__name__,
        )
        data = {k: UnknownKey(tuple(keys)) if k in unknown else v for k, v in data.items()}
        return cls._prepare({k: v for k, v in data.items() if v is not None}, info)

    @classmethod
    def _prepare(cls, data: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """Hook: fill in what a model derives from its input before validation."""
        return data
