"""`mtrl env ...`: create, check and play reward environments."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from domain.dataset import DatasetValidator
from mtrl.console import fail, out
from reward_envs.conformance import check_environment
from reward_envs.interface import Environment, Message, Record, Reply, closed_after, tool_turn
from reward_envs.registry import EnvironmentNotFound, load

env_app = typer.Typer(help="Create, check and play reward environments.", no_args_is_help=True)

_PACKAGE_NAME = re.compile(r"[a-z_][a-z0-9_]*")
# Template file -> where it goes in the new project (NAME is the package name).
_TEMPLATE_FILES = {
    "pyproject.toml.tmpl": "pyproject.toml",
    "__init__.py.tmpl": "NAME/__init__.py",
    "environment.py.tmpl": "NAME/environment.py",
    "test_environment.py.tmpl": "tests/test_environment.py",
}


# `--arg KEY=VALUE`, repeatable: what a training config's environment_args gives the environment.
Arguments = Annotated[
    list[str] | None,
    typer.Option(
        "--arg",
        help="An argument of the environment's load_environment, KEY=VALUE (VALUE as JSON when "
        "it parses, else text); repeat it for more. A config's environment_args.",
    ),
]


def _load(spec: str, arguments: list[str] | None = None) -> Environment:
    # Like `python -m`, the current folder is importable, so `mtrl env check mypkg` finds ./mypkg.
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return load(spec, **_parsed(arguments or []))
    except EnvironmentNotFound as missing:
        raise fail(str(missing)) from None


def _parsed(arguments: list[str]) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for argument in arguments:
        key, equals, value = argument.partition("=")
        if not equals or not key.isidentifier():
            raise fail(f"--arg {argument!r}: give KEY=VALUE, e.g. --arg url=http://localhost:8000")
        try:
            parsed[key] = json.loads(value)
        except json.JSONDecodeError:
            parsed[key] = value
    return parsed


def _records(path: Path) -> list[Record]:
    """Records from a .jsonl file of {"id": ..., "metadata": {...}} lines."""
    records = []
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise fail(f"{path}: cannot read ({error})") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            records.append(Record(id=str(item["id"]), metadata=dict(item.get("metadata") or {})))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
            raise fail(
                f"{path}: line {number}: not a record with id and metadata ({error})"
            ) from None
    return records


@env_app.command("check")
def check(
    spec: Annotated[
        str, typer.Argument(help="Registered name, module, .py file or package folder.")
    ],
    data: Annotated[
        Path | None,
        typer.Option(help="Records to play (.jsonl); default: the environment's examples."),
    ] = None,
    episodes: Annotated[
        int, typer.Option(min=1, max=1000, help="Example episodes per check.")
    ] = 16,
    seed: Annotated[int, typer.Option(help="Seed for records and replies.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    arguments: Arguments = None,
) -> None:
    """Run the conformance kit; exit 1 when any check fails."""
    environment = _load(spec, arguments)
    records = _records(data) if data else None
    report = check_environment(environment, records, episodes=episodes, seed=seed)
    if as_json:
        out.print_json(json.dumps(report.as_dict()))
    else:
        table = Table("check", "result", "detail", title=f"conformance: {report.environment}")
        for result in report.results:
            verdict = "[green]pass[/]" if result.passed else "[red]FAIL[/]"
            table.add_row(result.name, verdict, Text(result.detail))
        out.print(table)
    raise typer.Exit(0 if report.passed else 1)


@env_app.command("new")
def new(
    name: Annotated[
        str, typer.Argument(help="Package name of the new environment (a Python identifier).")
    ],
    directory: Annotated[
        Path, typer.Option("--dir", help="Where to create the project folder.")
    ] = Path("."),
) -> None:
    """Write a working environment package, with a test, to start from."""
    if not _PACKAGE_NAME.fullmatch(name):
        raise fail(f"{name!r} is not a package name: use lower case letters, digits and _")
    project = directory / name
    if project.exists():
        raise fail(f"{project} already exists; choose another name or --dir")
    templates = resources.files("reward_envs").joinpath("templates").joinpath("env")
    for template, target in _TEMPLATE_FILES.items():
        path = project / target.replace("NAME", name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            templates.joinpath(template).read_text(encoding="utf-8").replace("{{name}}", name)
        )
    out.print(f"Created {project}/. Next:", markup=False)
    mtrl, python = _as_typed(Path(sys.argv[0]), "mtrl"), _as_typed(Path(sys.executable), "python")
    out.print(f"  {mtrl} env check {project}    # the conformance kit", markup=False)
    out.print(f"  {python} -m pytest {project}    # its tests", markup=False)


@env_app.command("records")
def records(
    spec: Annotated[
        str, typer.Argument(help="Registered name, module, .py file or package folder.")
    ],
    count: Annotated[int, typer.Option(min=1, max=1_000_000, help="How many records.")] = 256,
    seed: Annotated[
        int, typer.Option(help="The dataset's seed: the same seed, the same file.")
    ] = 0,
    output: Annotated[
        Path | None, typer.Option("--out", help="Write the .jsonl here (default: stdout).")
    ] = None,
    arguments: Arguments = None,
) -> None:
    """Write a dataset of the environment's example records (Nova's record format, with the
    environment's tool definitions when it has any), checked as `mtrl validate` checks it."""
    environment = _load(spec, arguments)
    try:
        drawn = environment.example_records(count, seed=seed)
        lines = [json.dumps(dataset_line(record, environment.tools)) for record in drawn]
    except NotImplementedError as missing:
        raise fail(str(missing)) from None
    except Exception as error:  # noqa: BLE001 - the environment's failure, in one line
        raise fail(f"{spec}: {type(error).__name__}: {error}") from None
    text = "".join(f"{line}\n" for line in lines)
    validator = DatasetValidator()
    problems = list(validator.problems(io.BytesIO(text.encode())))
    if problems:
        raise fail(f"{spec}: its example records are not a valid dataset: {problems[0]}")
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text, encoding="utf-8")
        out.print(f"Wrote {len(lines)} records to {output}", markup=False)


def dataset_line(record: Record, tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A record as a dataset line: its id and metadata, and the tools the model may call."""
    line: dict[str, Any] = {"id": record.id, "metadata": dict(record.metadata)}
    if tools:
        line["tools"] = [dict(tool) for tool in tools]
    return line


def _as_typed(program: Path, name: str) -> str:
    """How to run `program` from here: `name` when that is what PATH finds, else its path
    (relative when under this folder): hints that work as printed, venv active or not."""
    found = shutil.which(name)
    if found and Path(found).resolve() == program.resolve():
        return name
    try:
        return str(program.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(program.absolute())


def _show(text: str) -> None:
    """An environment's text as it is: `[crane]` is the answer format, not markup."""
    out.print(text, highlight=False, markup=False)


@env_app.command("play")
def play(
    spec: Annotated[str, typer.Argument(help="Environment to play, e.g. wordle.")] = "wordle",
    answer: Annotated[
        str | None, typer.Option(help="The record's metadata.answer (e.g. the secret word).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed for the episode.")] = 0,
    arguments: Arguments = None,
) -> None:
    """Play one episode by hand: you are the model."""
    environment = _load(spec, arguments)
    try:
        episode, messages = environment.reset(_played_record(environment, answer, seed), seed=seed)
    except ValueError as problem:
        raise fail(str(problem)) from None
    except Exception as error:  # noqa: BLE001 - the environment's failure, in one line
        raise fail(f"reset: {type(error).__name__}: {error}") from None
    rewards: list[float] = []
    for message in messages:
        _show(message["content"])
    if environment.tools:
        names = [tool["function"]["name"] for tool in environment.tools]
        _show(f"Tools: {', '.join(names)}. Call one as: NAME {{JSON arguments}}")
    with closed_after(episode):
        for turn in range(environment.max_turns):
            typed = typer.prompt("you", prompt_suffix="> ", default="", show_default=False)
            reply = Reply.of(_typed_reply(typed, environment.tools, turn), environment.tools)
            try:
                result = episode.act(reply)
            except Exception as error:  # noqa: BLE001 - the environment's failure, in one line
                raise fail(f"turn {turn + 1}: {type(error).__name__}: {error}") from None
            rewards.append(result.reward)
            for message in result.messages:
                _show(message["content"])
            if result.done:
                break
    out.print(f"episode reward: {environment.aggregate(rewards):.3f}")


def _played_record(environment: Environment, answer: str | None, seed: int) -> Record:
    """The environment's example record for `seed` (none: an empty one), with `answer` as its
    metadata.answer when given."""
    try:
        (record,) = environment.example_records(1, seed=seed)
    except NotImplementedError:
        record = Record(id=f"play-{seed}")
    if answer is None:
        return record
    return dataclasses.replace(record, metadata={**record.metadata, "answer": answer})


def _typed_reply(typed: str, tools: Sequence[Mapping[str, Any]], turn: int) -> str | Message:
    """What a player typed: a tool call when it starts with a tool's name, else text."""
    name, _, arguments = typed.strip().partition(" ")
    if not any(tool["function"]["name"] == name for tool in tools):
        return typed
    return tool_turn(name, arguments.strip() or "{}", call_id=f"call_{turn}")
