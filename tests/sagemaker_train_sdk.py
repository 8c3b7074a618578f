"""The SageMaker SDK's managed multi-turn RL modules (sagemaker-train 1.27.0, sagemaker-core
2.27.0), loaded from their installed source: the packages come without their dependencies (their
pins clash with ours: rich < 15, protobuf < 7, importlib-metadata < 7, mlflow 3.17) and their
package `__init__`s import the whole SDK, while the modules the tests run as oracles need only
pydantic, botocore and requests. Each is loaded as it is, under the names its own imports use,
without touching the rest of the process."""

from __future__ import annotations

import functools
import importlib.util
import sys
from importlib.metadata import distribution
from pathlib import Path
from types import ModuleType
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
def token_generator() -> ModuleType:
    """sagemaker-core's token_generator package: `generate_token`, `_generate_token`."""
    core = _load(
        "sagemaker.core.token_generator.token_generator",
        _source("sagemaker-core", "sagemaker/core/token_generator/token_generator.py"),
        {},
    )
    return _load(
        "sagemaker.core.token_generator",
        _source("sagemaker-core", "sagemaker/core/token_generator/__init__.py"),
        {"sagemaker.core.token_generator.token_generator": core},
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


@functools.cache
def rft_feedback() -> ModuleType:
    """sagemaker/train/rft/feedback.py: RolloutFeedbackClient."""
    return _load(
        "sagemaker.train.rft.feedback",
        _source("sagemaker-train", "sagemaker/train/rft/feedback.py"),
        {
            "sagemaker.train.rft.models": rft_models(),
            "sagemaker.core.token_generator": token_generator(),
        },
    )
