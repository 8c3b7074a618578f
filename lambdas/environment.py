"""A function's environment as its settings model spells it: a function reads its settings
from its environment (`EnvironmentSettings.from_environment`), and the stacks write that
environment through the same model (`environment_for`), so each variable's name has one home —
the model's alias."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Self

from pydantic import BaseModel, ConfigDict


class EnvironmentSettings(BaseModel):
    """Settings read once from a function's environment, by each field's alias."""

    model_config = ConfigDict(frozen=True)

    @classmethod
    def from_environment(cls, environment: Mapping[str, str]) -> Self:
        return cls.model_validate(dict(environment))


def environment_for(model: type[BaseModel], **values: str | int) -> dict[str, str]:
    """The environment variables that set these fields (by field name) of `model`."""
    fields = model.model_fields
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise KeyError(f"{model.__name__} has no field {', '.join(unknown)}")
    return {str(fields[name].alias): str(value) for name, value in values.items()}
