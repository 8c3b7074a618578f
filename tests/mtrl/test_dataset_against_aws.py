"""Our verdict on a dataset record is AWS's: a differential test against amzn-nova-forge's own
record model, `RFTMultiturnDatasetSample` (amzn_nova_forge/dataset/dataset_validator/
rft_multiturn_dataset_validator.py, version 1.4.10, installed without its dependencies by
`make install`: it needs Python 3.12 and the SageMaker SDK as a whole, the model only pydantic).

The records generated here are in the SDK's format; the BYOO data preparation's additions
(top-level `messages` and `tools`, `metadata.problem`) have their own tests in test_dataset.py.
"""

from __future__ import annotations

import enum
import functools
import importlib.util
import io
import json
import sys
from importlib.metadata import PackageNotFoundError, distribution
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from domain.dataset import DatasetValidator

AWS_VERSION = "1.4.10"
MODULE = "amzn_nova_forge.dataset.dataset_validator.rft_multiturn_dataset_validator"
MISSING = object()  # a key left out


@functools.cache
def aws_record_model() -> Any:
    try:
        package = distribution("amzn-nova-forge")
    except PackageNotFoundError:
        pytest.fail(
            "amzn-nova-forge is not installed: run `make install` (it installs it --no-deps)"
        )
    assert package.version == AWS_VERSION, f"pinned against {AWS_VERSION}, found {package.version}"
    path = package.locate_file(MODULE.replace(".", "/") + ".py")
    # The module imports two names for its validator classes, which we do not use: the model enum
    # and the base validator (whose own imports need boto3, filetype and the SageMaker SDK).
    # Stand-ins for those two, only while the module loads.
    enums = ModuleType("amzn_nova_forge.core.enums")
    enums.Model = enum.Enum("Model", "NOVA_LITE_2")  # type: ignore[attr-defined]
    base = ModuleType("amzn_nova_forge.dataset.dataset_validator.dataset_validator")
    base.BaseDatasetValidator = object  # type: ignore[attr-defined]
    stand_ins = {
        "amzn_nova_forge": ModuleType("amzn_nova_forge"),
        "amzn_nova_forge.core": ModuleType("amzn_nova_forge.core"),
        "amzn_nova_forge.core.enums": enums,
        "amzn_nova_forge.dataset": ModuleType("amzn_nova_forge.dataset"),
        "amzn_nova_forge.dataset.dataset_validator": ModuleType(
            "amzn_nova_forge.dataset.dataset_validator"
        ),
        base.__name__: base,
    }
    saved = {name: sys.modules.get(name) for name in stand_ins}
    sys.modules.update(stand_ins)
    try:
        spec = importlib.util.spec_from_file_location(MODULE, str(path))
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    finally:
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
    return module.RFTMultiturnDatasetSample


def aws_accepts(record: Any) -> bool:
    try:
        aws_record_model().model_validate(record)
    except ValidationError:
        return False
    return True


def we_accept(record: Any) -> bool:
    validator = DatasetValidator()
    return not list(validator.problems(io.BytesIO(json.dumps(record).encode() + b"\n")))


def _object(**fields: st.SearchStrategy) -> st.SearchStrategy[dict[str, Any]]:
    """A JSON object whose keys may each be left out."""
    return st.fixed_dictionaries(
        {key: st.one_of(st.just(MISSING), value) for key, value in fields.items()}
    ).map(lambda drawn: {key: value for key, value in drawn.items() if value is not MISSING})


# Anything: each field drawn from right and wrong values alike (most records come out invalid).
TEXT = st.sampled_from(["", " ", "\t\n", "hi", " padded ", "x" * 300, "a\tb", "ünï"])
NOT_TEXT = st.sampled_from([None, 5, 1.5, True, [], {}, ["hi"], [{"type": "text", "text": "hi"}]])
CALL = _object(
    id=st.one_of(st.just("c1"), NOT_TEXT),
    type=st.sampled_from(["function", "tool", 5]),
    function=st.one_of(
        _object(name=st.just("lookup"), arguments=st.sampled_from(["{}", "", {"a": 1}])),
        NOT_TEXT,
    ),
    extra=st.just(1),
)
MESSAGE = _object(
    role=st.sampled_from(["system", "user", "assistant", "tool", "robot", 5]),
    content=st.one_of(TEXT, NOT_TEXT),
    tool_calls=st.one_of(st.lists(CALL, max_size=2), NOT_TEXT),
    tool_call_id=st.one_of(st.just("c1"), NOT_TEXT),
    name=st.just("someone"),
)
PROMPT = st.one_of(TEXT, NOT_TEXT, st.lists(st.one_of(MESSAGE, NOT_TEXT), max_size=3))
INFO = st.sampled_from(
    [None, {}, {"level": 1}, "null", "{}", '{"a": [1]}', "3", "x", "{", "", 5, [1], True]
)
METADATA = _object(
    prompt=PROMPT,
    answer=st.one_of(TEXT, NOT_TEXT),
    task=st.one_of(TEXT, NOT_TEXT),
    info=INFO,
    level=st.just(1),  # a key AWS's metadata does not know
)
RECORD = _object(
    id=st.one_of(TEXT, NOT_TEXT),
    metadata=st.one_of(METADATA, NOT_TEXT),
    pad=st.just(1),  # a key AWS's record does not know
)

# Near the line: right values mostly, a wrong one now and then (about half come out valid).
GOOD_TEXT = st.sampled_from(["hi", " padded ", "x" * 300, "a\tb", "ünï"])
GOOD_CALL = st.fixed_dictionaries(
    {
        "id": st.just("c1"),
        "type": st.just("function"),
        "function": st.just({"name": "f", "arguments": "{}"}),
    }
)
GOOD_MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user"]), "content": GOOD_TEXT}),
    st.fixed_dictionaries(
        {"role": st.just("assistant"), "content": st.one_of(GOOD_TEXT, st.just(""))}
    ),
    st.fixed_dictionaries(
        {"role": st.just("assistant"), "tool_calls": st.lists(GOOD_CALL, min_size=1, max_size=2)},
        optional={"content": GOOD_TEXT},
    ),
    st.fixed_dictionaries(
        {"role": st.just("tool"), "content": GOOD_TEXT, "tool_call_id": st.just("c1")}
    ),
)


def _with(message: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    changed = {k: v for k, v in message.items() if k != key}
    return changed if value is MISSING else {**changed, key: value}


# A right message with one field left out or set to anything: the rules at their edges.
NEAR_MISS = st.builds(
    _with,
    GOOD_MESSAGE,
    st.sampled_from(["role", "content", "tool_calls", "tool_call_id"]),
    st.one_of(st.just(MISSING), TEXT, NOT_TEXT, st.just([]), st.sampled_from(["tool", "user"])),
)
NEAR_PROMPT = st.one_of(
    GOOD_TEXT,
    st.lists(st.one_of(GOOD_MESSAGE, GOOD_MESSAGE, NEAR_MISS, MESSAGE), min_size=1, max_size=3),
    PROMPT,
)
NEAR_METADATA = st.fixed_dictionaries(
    {"prompt": NEAR_PROMPT},
    optional={
        "answer": st.one_of(GOOD_TEXT, GOOD_TEXT, GOOD_TEXT, NOT_TEXT),
        "task": st.one_of(GOOD_TEXT, GOOD_TEXT, GOOD_TEXT, NOT_TEXT),
        "info": INFO,
    },
)
NEAR_RECORD = st.fixed_dictionaries(
    {"id": st.one_of(GOOD_TEXT, GOOD_TEXT, GOOD_TEXT, TEXT), "metadata": NEAR_METADATA},
    optional={"pad": st.just(1)},
)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=st.one_of(NEAR_RECORD, NEAR_RECORD, RECORD, NOT_TEXT))
# The cases the issue names (#18, item 8), each both ways.
@example(
    record={
        "id": "a",
        "metadata": {"prompt": [{"role": "assistant", "content": "c", "tool_calls": []}]},
    }
)
@example(record={"id": "a", "metadata": {"prompt": [{"role": "tool", "content": "r"}]}})
@example(record={"id": "a", "metadata": {"prompt": "p", "info": "null"}})
@example(record={"id": "a", "metadata": {"prompt": "p", "info": {"k": 1}}})
@example(record={"id": "a", "metadata": {"prompt": "p", "level": 1}})
@example(record={"id": "  ", "metadata": {"prompt": "p"}})
@example(record={"id": "a", "metadata": {"prompt": [{"role": "user", "content": ""}]}})
@example(
    record={
        "id": "a",
        "metadata": {"prompt": [{"role": "tool", "tool_call_id": "c", "content": "r"}]},
    }
)
@example(
    record={
        "id": "a",
        "metadata": {
            "prompt": [
                {"role": "user", "content": "u"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
            ]
        },
    }
)
def test_we_accept_a_record_exactly_when_aws_does(record: Any) -> None:
    assert we_accept(record) == aws_accepts(record), json.dumps(record)[:500]


def test_the_generator_reaches_both_verdicts() -> None:
    """The comparison means something only if both verdicts are common in what it draws."""
    verdicts: list[bool] = []

    @settings(max_examples=400, deadline=None, database=None)
    @given(record=NEAR_RECORD)
    def draw(record: Any) -> None:
        verdicts.append(aws_accepts(record))

    draw()
    assert 0.2 < sum(verdicts) / len(verdicts) < 0.8, sum(verdicts)
