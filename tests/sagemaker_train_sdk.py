"""The SageMaker SDK's managed multi-turn RL modules (sagemaker-train 1.27.0, sagemaker-core
2.27.0), loaded from their installed source: the packages come without their dependencies (their
pins clash with ours: rich < 15, protobuf < 7, importlib-metadata < 7, mlflow 3.17) and their
package `__init__`s import the whole SDK, while the modules the tests run as oracles need only
pydantic, botocore and requests. Each is loaded as it is, under the names its own imports use,
without touching the rest of the process."""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import logging
import re
import sys
from importlib.metadata import distribution
from pathlib import Path
from types import ModuleType
from typing import Any, Optional
from unittest import mock

from pydantic import BaseModel


def _source(package: str, path: str) -> Path:
    found = Path(str(distribution(package).locate_file(path)))
    if not found.is_file():
        raise FileNotFoundError(f"{package} has no {path}: run `make install` (it installs it)")
    return found


def _load(name: str, path: Path, known: dict[str, ModuleType]) -> ModuleType:
    """`path` executed as module `name`, its imports of `known` names answered by them."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with mock.patch.dict(sys.modules, known):
        spec.loader.exec_module(module)
    # Its pydantic models resolve their (postponed) annotations in the module's own names: it
    # is not in sys.modules, where pydantic would look.
    for value in list(vars(module).values()):
        if isinstance(value, type) and issubclass(value, BaseModel) and value.__module__ == name:
            value.model_rebuild(_types_namespace=vars(module))
    return module


@functools.cache
def rft_models() -> ModuleType:
    """sagemaker/train/rft/models.py: RolloutRequest, RolloutMetadata, InferenceParams."""
    return _load(
        "sagemaker.train.rft.models",
        _source("sagemaker-train", "sagemaker/train/rft/models.py"),
        {},
    )


@functools.cache
def rft_context() -> ModuleType:
    return _load(
        "sagemaker.train.rft.context",
        _source("sagemaker-train", "sagemaker/train/rft/context.py"),
        {"sagemaker.train.rft.models": rft_models()},
    )


@functools.cache
def rft_headers() -> ModuleType:
    """sagemaker/train/rft/headers.py: make_inference_headers."""
    return _load(
        "sagemaker.train.rft.headers",
        _source("sagemaker-train", "sagemaker/train/rft/headers.py"),
        {"sagemaker.train.rft.models": rft_models(), "sagemaker.train.rft.context": rft_context()},
    )


def _telemetry_stub() -> ModuleType:
    """The SDK's telemetry, which would import the whole SDK and call AWS: its decorator passes
    the function through, its failure report does nothing (neither changes what a call does)."""
    stub = ModuleType("sagemaker.core.telemetry.telemetry_logging")
    stub._telemetry_emitter = lambda **_: lambda function: function  # type: ignore[attr-defined]
    stub._emit_failure_telemetry = lambda *_: None  # type: ignore[attr-defined]
    return stub


@functools.cache
def fine_tuning_options() -> type:
    """sagemaker/train/common.py's FineTuningOptions: a recipe's hyperparameters with the
    checks the SDK makes on each value set."""
    telemetry = {
        "sagemaker.core.telemetry.telemetry_logging": _telemetry_stub(),
        "sagemaker.core.telemetry.constants": _load(
            "sagemaker.core.telemetry.constants",
            _source("sagemaker-core", "sagemaker/core/telemetry/constants.py"),
            {},
        ),
    }
    common = _load("sagemaker.train.common", _source("sagemaker-train", TRAIN_COMMON), telemetry)
    return common.FineTuningOptions


TRAIN_COMMON = "sagemaker/train/common.py"
MTRL_TRAINER = "sagemaker/train/multi_turn_rl_trainer.py"
# MultiTurnRLTrainer's methods that make the job document, and the module's names they use.
DOCUMENT_METHODS = (
    "_build_job_config", "_build_job_config_document", "_build_agent_config",
    "_build_input_data_config", "_resolve_channel", "_build_output_data_config",
    "_build_model_package_config", "_build_training_config", "_build_mlflow_config",
)  # fmt: skip
DOCUMENT_CONSTANTS = (
    "BEDROCK_AGENT_CORE_ARN_PATTERN", "LAMBDA_ARN_PATTERN", "S3_URI_PATTERN",
    "JOB_CONFIG_SCHEMA_VERSION", "JOB_CATEGORY",
)  # fmt: skip


def _members_of(
    path: str,
    class_name: str,
    members: tuple[str, ...],
    namespace: dict[str, Any],
    constants: tuple[str, ...] = (),
) -> type:
    """A class holding `members` of the SDK's class `class_name` as its source at `path` writes
    them (decorators kept), and the module's `constants` (and functions) they read, executed
    with `namespace` for the rest of the names they use."""
    source = _source("sagemaker-train", path)
    tree = ast.parse(source.read_text(encoding="utf-8"))
    assigned = _module_definitions(tree, constants)
    (found,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    methods = [
        node for node in found.body if isinstance(node, ast.FunctionDef) and node.name in members
    ]
    assert {m.name for m in methods} == set(members), f"the SDK's {class_name} changed"
    holder = ast.ClassDef(
        name=f"{class_name}Members", bases=[], keywords=[], body=methods, decorator_list=[],
        type_params=[],
    )  # fmt: skip
    module = ast.fix_missing_locations(ast.Module(body=[*assigned, holder], type_ignores=[]))
    exec(compile(module, str(source), "exec"), namespace)
    return namespace[f"{class_name}Members"]


def _module_definitions(tree: ast.Module, names: tuple[str, ...]) -> list[ast.stmt]:
    """The module's assignments to `names` and its functions named so."""
    return [
        node
        for node in tree.body
        if (isinstance(node, ast.FunctionDef) and node.name in names)
        or (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id in names for t in node.targets)
        )
    ]


@functools.cache
def job_document_builder() -> type:
    """A class holding MultiTurnRLTrainer's document methods as the SDK writes them (compiled
    from its source, decorators kept), and the module constants they read. An instance given
    the trainer's attributes builds the document `train` would send, without the hub, S3 or
    the model package groups the trainer's `__init__` calls on (their results are the
    attributes). The SDK's resource classes are stand-ins no argument is an instance of: the
    runs pass ARNs and S3 URIs as strings, as a user of the SDK may."""
    stand_ins = {
        name: type(name, (), {})
        for name in (
            "DataSet",
            "ModelPackageGroup",
            "ModelPackage",
            "MlflowApp",
            "CustomAgentLambda",
        )
    }
    no_mlflow_app = {  # an account with no default MLflow app: the SDK's lookup finds none
        "TrainDefaults": type(
            "TrainDefaults", (), {"get_sagemaker_session": staticmethod(lambda **_: None)}
        ),
        "_resolve_mlflow_resource_arn": lambda *_, **__: None,
        "MIN_MLFLOW_VERSION": None,
    }
    namespace: dict[str, Any] = {
        **no_mlflow_app,
        "json": json, "re": re, "logger": logging.getLogger("sagemaker-train"),
        "Optional": Optional, **stand_ins,
    }  # fmt: skip
    return _members_of(
        MTRL_TRAINER, "MultiTurnRLTrainer", DOCUMENT_METHODS, namespace, DOCUMENT_CONSTANTS
    )


AGENT_RFT_JOB = "sagemaker/train/agent_rft_job.py"
# AgentRFTJob's readers of what DescribeJob answers with.
SERVICE_OUTPUT_READERS = (
    "_parse_config_document", "output_model_package_arn", "mlflow_details",
    "billable_token_usage", "progress_info",
)  # fmt: skip


@functools.cache
def agent_rft_job_reader() -> type:
    """AgentRFTJob's readers of a described job's document, as the SDK writes them (compiled
    from its source): an instance given `_job` (anything with the described
    `job_config_document`) and `_cached_config = None` reads it as the SDK does."""
    return _members_of(
        AGENT_RFT_JOB, "AgentRFTJob", SERVICE_OUTPUT_READERS, {"json": json, "Optional": Optional}
    )


MTRL_EVALUATOR = "sagemaker/train/evaluate/multi_turn_rl_evaluator.py"
RECIPE_RESOLVER = "sagemaker/train/recipe_resolver.py"


@functools.cache
def evaluation_document_builder() -> type:
    """A class holding MultiTurnRLEvaluator's `_build_template_context` as the SDK writes it
    (compiled from its source): an instance given the evaluator's resolved attributes (what
    `evaluate` resolves from the hub, the trainer and the account before it) builds the
    documents of its pipeline's evaluation steps — `job_config_document_str` (the base
    model), `job_config_document_ft_str` (a fine-tuned model's package)."""
    namespace: dict[str, Any] = {
        "_logger": logging.getLogger("sagemaker-train"),
        "Any": Any, "Dict": dict, "List": list, "Optional": Optional,
    }  # fmt: skip
    return _members_of(
        MTRL_EVALUATOR, "MultiTurnRLEvaluator", ("_build_template_context",), namespace,
        ("_tags_with_capitalized_keys",),
    )  # fmt: skip


@functools.cache
def flatten_resolved_recipe() -> Any:
    """recipe_resolver.py's `flatten_resolved_recipe` as the SDK writes it (its module imports
    omegaconf, whose pinned ANTLR runtime clashes with ours: the function is compiled alone)."""
    source = _source("sagemaker-train", RECIPE_RESOLVER)
    tree = ast.parse(source.read_text(encoding="utf-8"))
    found = _module_definitions(tree, ("flatten_resolved_recipe",))
    assert len(found) == 1, "the SDK's recipe_resolver.py changed"
    namespace: dict[str, Any] = {"Any": Any, "Dict": dict}
    module = ast.fix_missing_locations(ast.Module(body=found, type_ignores=[]))
    exec(compile(module, str(source), "exec"), namespace)
    return namespace["flatten_resolved_recipe"]
