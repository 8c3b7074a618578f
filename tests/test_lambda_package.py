"""What the deployed functions import is in their asset or in the Lambda runtime: each handler
module is imported from a copy of the packaged source alone (site hooks off, so the editable
install cannot help), and every third-party module it pulls in must come from REQUIREMENTS
(or their dependencies) or boto3, which the runtime provides."""

from __future__ import annotations

from pathlib import Path

import pytest

from stacks.components.lambda_code import PACKAGES, REQUIREMENTS
from stacks.components.project_files import pinned
from tests.conftest import Synthesized
from tests.packaging import (
    OPTIONAL_IMPORTS,
    assert_installed,
    pyproject_pins,
    third_party_imports,
)

RUNTIME_PROVIDED = ("boto3",)  # and its dependencies


def _handler_modules(app: Synthesized) -> set[str]:
    handlers = {
        resource["Properties"]["Handler"]
        for template in app.templates.values()
        for resource in template["Resources"].values()
        if resource["Type"] == "AWS::Lambda::Function"
        and "Code" in resource["Properties"]
        and "S3Key" in resource["Properties"]["Code"]
        and resource["Properties"].get("Handler", "").startswith(PACKAGES)
    }
    return {handler.rsplit(".", 1)[0] for handler in handlers}


def test_handlers_import_with_only_the_asset_and_the_runtime(
    default_app: Synthesized, tmp_path: Path
) -> None:
    modules = _handler_modules(default_app)
    assert {
        "lambdas.pipeline.handlers",
        "lambdas.router.proxy",
        "lambdas.kubernetes.bootstrap",
        "lambdas.kubernetes.chart_install",
    } <= modules
    imported = third_party_imports(PACKAGES, modules, tmp_path) - OPTIONAL_IMPORTS
    assert_installed(imported, REQUIREMENTS + RUNTIME_PROVIDED)


def test_the_asset_takes_pyprojects_pins_and_names_any_it_lacks() -> None:
    """The Lambda asset is installed at the versions the project runs with (pyproject.toml)."""
    pinned_here = pyproject_pins()
    assert [pinned_here[r.split("==")[0].lower()] for r in REQUIREMENTS] == [
        r.lower() for r in REQUIREMENTS
    ]
    with pytest.raises(LookupError) as lacking:
        pinned("pydantic", "left-pad")
    assert str(lacking.value) == "pyproject.toml's dependencies pin no left-pad"
