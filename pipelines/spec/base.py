"""The base of every spec model, and the error a spec raises.

Every model is frozen and refuses unknown YAML keys, naming the allowed ones. Validators raise
:func:`_error` so the message is ours and carries the field it is about (relative to the failing
model); :mod:`.errors` turns it into ``file: dotted.field: message`` of a :class:`SpecError`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError

from pipelines.errors import ConfigError


class SpecError(ConfigError):
    """A flow spec is invalid; the message names the file and the field."""


def _error(message: str, field: str = "") -> PydanticCustomError:
    """A validation error carrying our own wording; ``field`` is relative to the failing model."""
    return PydanticCustomError("conflux_spec", "{message}", {"message": message, "field": field})


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
        unknown = sorted(str(key) for key in data if key not in allowed)
        if unknown:
            raise _error(f"unknown field; allowed: {', '.join(keys)}", unknown[0])
        return cls._prepare({k: v for k, v in data.items() if v is not None}, info)

    @classmethod
    def _prepare(cls, data: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """Hook: fill in what a model derives from its input before validation."""
        return data
