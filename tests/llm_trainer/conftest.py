"""The open-weights trainer's tests run on the CPU with the tiny model (llm_trainer/tiny.py):
nothing is downloaded. `make test` installs the `llm` extra they need."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from llm_trainer.tiny import tiny_tokenizer

    return tiny_tokenizer()


@pytest.fixture
def model(tokenizer: Any) -> Any:
    from llm_trainer.tiny import tiny_model

    return tiny_model(tokenizer, seed=0)
