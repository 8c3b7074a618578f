"""The docs' table of the open-weights trainer's options (users/local-mode.md) is the config schema's
(`training_configs/schema.py` GrpoSettings): every key, its default and what it does."""

from __future__ import annotations

import json

from tests.readme import check_section
from training_configs.schema import GrpoSettings


def _default(value: object) -> str:
    return "none" if value is None else json.dumps(value)


def test_the_readme_lists_every_trainer_option_with_its_default() -> None:
    rows = ["| `grpo.` key | default | what it does |", "|---|---|---|"]
    for name, field in GrpoSettings.model_fields.items():
        description = (field.description or "").replace("|", "\\|")
        rows.append(f"| `{name}` | `{_default(field.default)}` | {description} |")
    check_section("grpo-settings", "\n".join(rows))
