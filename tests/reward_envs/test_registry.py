"""Loading environments by registered name, module, file or package folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from reward_envs.registry import EnvironmentNotFound, load, register, registered
from reward_envs.wordle import WordleEnvironment

FILE_ENV = """
from reward_envs.wordle import WordleEnvironment

class Renamed(WordleEnvironment):
    name = "renamed"

def load_environment(**kwargs):
    return Renamed()
"""


def test_wordle_by_name_and_by_module() -> None:
    assert isinstance(load("wordle"), WordleEnvironment)
    assert isinstance(load("reward_envs.wordle"), WordleEnvironment)


def test_a_python_file_and_a_package_folder(tmp_path: Path) -> None:
    file = tmp_path / "my_env.py"
    file.write_text(FILE_ENV)
    assert load(str(file)).name == "renamed"
    package = tmp_path / "pkg_env_for_test"
    package.mkdir()
    (package / "__init__.py").write_text(FILE_ENV)
    assert load(str(package)).name == "renamed"


def test_registered_class() -> None:
    @register("always-wordle-for-test")
    class AlwaysWordle(WordleEnvironment):
        name = "always"

    assert "always-wordle-for-test" in registered()
    assert load("always-wordle-for-test").name == "always"


def test_kwargs_reach_load_environment(tmp_path: Path) -> None:
    file = tmp_path / "named_env.py"
    file.write_text(
        "from reward_envs.wordle import WordleEnvironment\n"
        "def load_environment(**kwargs):\n"
        "    env = WordleEnvironment()\n"
        "    env.name = kwargs['name']\n"
        "    return env\n"
    )
    assert load(str(file), name="from-kwargs").name == "from-kwargs"
    with pytest.raises(EnvironmentNotFound, match="takes no options.*arguments given: difficulty"):
        load("wordle", difficulty="hard")


@pytest.mark.parametrize(
    ("spec", "content", "reason"),
    [
        ("no_such_env_module", None, "no such module or registered environment"),
        ("missing.py", None, "no such file"),
        ("no_entry.py", "x = 1\n", "has no load_environment"),
        ("wrong_type.py", "def load_environment():\n    return 42\n", "returned int, not a"),
    ],
)
def test_clear_errors(tmp_path: Path, spec: str, content: str | None, reason: str) -> None:
    target = spec
    if spec.endswith(".py"):
        target = str(tmp_path / spec)
        if content is not None:
            (tmp_path / spec).write_text(content)
    with pytest.raises(EnvironmentNotFound, match=reason):
        load(target)
