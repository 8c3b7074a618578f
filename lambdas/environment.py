"""A function's environment as its settings model spells it: the stacks write a function's
environment through the model that reads it (`environment_for`), so each variable's name has
one home — the model's alias."""

from __future__ import annotations

from pydantic import BaseModel


def environment_for(model: type[BaseModel], **values: str | int) -> dict[str, str]:
    """The environment variables that set these fields (by field name) of `model`."""
    fields = model.model_fields
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise KeyError(f"{model.__name__} has no field {', '.join(unknown)}")
    return {str(fields[name].alias): str(value) for name, value in values.items()}
