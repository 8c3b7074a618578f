"""The documentation's reference of every training config key (docs/users/datasets-and-configs.md)
is generated from the config schema (`training_configs/schema.py`): each key, its type and
bounds, its default (or that it is required) and what it does. `UPDATE_README=1` rewrites it."""

from __future__ import annotations

import json
import re
import types
import typing
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from tests.readme import check_section
from training_configs.schema import GrpoSettings, TrainingConfig

BOUNDS = {annotated_types.Ge: ("ge", "≥"), annotated_types.Gt: ("gt", ">"),
          annotated_types.Le: ("le", "≤"), annotated_types.Lt: ("lt", "<")}  # fmt: skip


def _type(annotation: Any) -> str:
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return " or ".join(f"`{json.dumps(value)}`" for value in arguments)
    if origin in (typing.Union, types.UnionType):
        kinds = [_type(a) for a in arguments if a is not type(None)]
        return " or ".join(kinds) + (" or none" if type(None) in arguments else "")
    if origin is list:
        return f"list of {_type(arguments[0])}"
    if origin is dict:
        return "object"
    if origin is tuple:
        return f"[{', '.join(_type(a) for a in arguments)}]"
    if origin is typing.Annotated:
        return _type(arguments[0])
    return getattr(annotation, "__name__", str(annotation))


def _bounds(field: FieldInfo) -> str:
    said = [f"{sign} {getattr(m, name)}" for m in field.metadata
            for kind, (name, sign) in BOUNDS.items() if isinstance(m, kind)]  # fmt: skip
    return f" ({', '.join(said)})" if said else ""


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
        return "the default rules" if value and isinstance(value[0], BaseModel) else "`[]`"
    if field.default is PydanticUndefined:
        return "required"
    if isinstance(field.default, BaseModel):
        return "(its keys)"
    return "none" if field.default is None else f"`{json.dumps(field.default)}`"


def _model(annotation: Any) -> type[BaseModel] | None:
    kinds = typing.get_args(annotation) or (annotation,)
    for kind in kinds:
        inner = typing.get_args(kind)[0] if typing.get_origin(kind) is list else kind
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            return inner
    return None


def _rows(model: type[BaseModel], prefix: str = "") -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        key, nested = f"{prefix}{name}", _model(field.annotation)
        what = (field.description or "").replace("|", "\\|").replace("<", "&lt;")
        if nested is GrpoSettings:
            what += " — every key: [the trainer's options](local-mode.md#grpo-settings-table)"
        kind = _type(field.annotation) + _bounds(field)
        rows.append(f"| `{key}` | {kind} | {_default(field)} | {what} |")
        if nested is not None and nested is not GrpoSettings:
            many = typing.get_origin(field.annotation) is list
            rows += _rows(nested, f"{key}[]." if many else f"{key}.")
    return rows


def test_the_docs_list_every_training_config_key() -> None:
    rows = ["| key | type | default | what it does |", "|---|---|---|---|", *_rows(TrainingConfig)]
    check_section("training-config-keys", "\n".join(rows))


def _configuration_rows() -> dict[str, str]:
    """The operators' configuration table (docs/operators/configuration.md): each key, with the
    default cell of its row."""
    from tests.readme import DOCS

    rows = {}
    for line in (DOCS / "operators" / "configuration.md").read_text().splitlines():
        cells = line.split(" | ")
        if line.startswith("| `") and len(cells) >= 3:
            for key in re.findall(r"`([a-z_]+)`", cells[0]):
                rows[key] = cells[1]
    return rows


def test_the_operators_table_has_every_deployment_key_with_its_default() -> None:
    """Hand-written (its meanings say more than the model's descriptions), held to the model:
    no key missing or left over, and each scalar default as `stacks/config.py` has it."""
    from stacks.config import PlatformConfig

    rows = _configuration_rows()
    assert set(rows) == set(PlatformConfig.model_fields)
    for name, field in PlatformConfig.model_fields.items():
        default = field.default
        if isinstance(default, bool | int | float | str) and not isinstance(default, BaseModel):
            shown = json.dumps(default) if isinstance(default, bool) else str(default)
            assert shown in rows[name], (name, shown, rows[name])
        elif default is None:
            assert "unset" in rows[name] or "none" in rows[name], (name, rows[name])
