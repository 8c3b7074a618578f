"""Finding an environment by name, module or path: `load("wordle")`, `load("my_pkg.env")`,
`load("./envs/my_env.py")`, `load("./my_env_package/")`.

A module is an environment when it exposes `load_environment(**kwargs)` returning an
`Environment` (the entry point verifiers-style environments use). A class or factory can also
be registered under a short name with `@register("name")`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from reward_envs.interface import Environment

Factory = Callable[..., Environment]

_REGISTRY: dict[str, Factory | str] = {
    "wordle": "reward_envs.wordle",
    "support_desk": "reward_envs.support_desk",
    "openenv": "reward_envs.openenv",
}


class EnvironmentNotFound(LookupError):
    """The spec names no environment; the message says what was tried and how to fix it."""


def register(name: str) -> Callable[[Factory], Factory]:
    """Decorator: make an Environment subclass (or factory) loadable as `name`."""

    def decorate(factory: Factory) -> Factory:
        _REGISTRY[name] = factory
        return factory

    return decorate


def registered() -> list[str]:
    return sorted(_REGISTRY)


def load(spec: str, **kwargs: Any) -> Environment:
    """The environment that `spec` names, built with `kwargs`."""
    target = _REGISTRY.get(spec, spec)
    if callable(target):
        return _checked(_built(target, kwargs, spec), spec)
    module = _import(target)
    entry = getattr(module, "load_environment", None)
    if not callable(entry):
        raise EnvironmentNotFound(
            f"{spec}: module {module.__name__} has no load_environment(**kwargs); add one that "
            "returns your Environment (see `mtrl env new`)"
        )
    return _checked(_built(entry, kwargs, spec), spec)


def _built(factory: Factory, kwargs: dict[str, Any], spec: str) -> Environment:
    """The factory's environment; arguments it refuses are the caller's to fix, not a crash."""
    try:
        return factory(**kwargs)
    except (TypeError, ValueError) as refused:
        given = ", ".join(sorted(kwargs)) or "none"
        raise EnvironmentNotFound(f"{spec}: {refused} (arguments given: {given})") from None


def _import(target: str) -> ModuleType:
    path = Path(target)
    if path.suffix == ".py" or path.is_dir() or "/" in target:
        return _import_path(path.resolve(), target)
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as missing:
        if missing.name and target.startswith(missing.name):
            raise EnvironmentNotFound(
                f"{target}: no such module or registered environment (registered: "
                f"{', '.join(registered())}); give an importable module, a .py file or a package folder"
            ) from None
        raise


def _import_path(path: Path, spec: str) -> ModuleType:
    if path.is_dir():
        package = path if (path / "__init__.py").is_file() else _package_in(path, spec)
        parent, name = str(package.parent), package.name
        if parent not in sys.path:
            sys.path.insert(0, parent)
        return importlib.import_module(name)
    if not path.is_file():
        raise EnvironmentNotFound(f"{spec}: no such file")
    module_name = f"mtrl_user_env_{path.stem}"
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise EnvironmentNotFound(f"{spec}: cannot be imported as Python")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module
    loader_spec.loader.exec_module(module)
    return module


def _package_in(project: Path, spec: str) -> Path:
    """The environment package of a project folder (what `mtrl env new` writes: `NAME/NAME`, or
    a `src/` layout): the one package in it, its own name first."""
    own = [project / project.name, project / "src" / project.name]
    found = [folder for folder in own if (folder / "__init__.py").is_file()]
    if not found:
        found = sorted(
            folder.parent
            for pattern in ("*/__init__.py", "src/*/__init__.py")
            for folder in project.glob(pattern)
            if folder.parent.name != "tests"
        )
    if len(found) == 1:
        return found[0]
    if not found:
        raise EnvironmentNotFound(
            f"{spec}: {project} is a folder with no Python package in it (no __init__.py); give "
            "the package folder, a module or a .py file"
        )
    names = ", ".join(str(folder.relative_to(project)) for folder in found)
    raise EnvironmentNotFound(
        f"{spec}: {project} holds several packages ({names}); give the one to check, e.g. "
        f"{project / found[0].relative_to(project)}"
    )


def _checked(environment: object, spec: str) -> Environment:
    if not isinstance(environment, Environment):
        raise EnvironmentNotFound(
            f"{spec}: load_environment returned {type(environment).__name__}, not a "
            "reward_envs.interface.Environment"
        )
    return environment
