"""A gated model's Hugging Face token: read from the secret the preset names (moto's Secrets
Manager), as the token itself or the console's key/value JSON; a secret that is missing, denied
or holds no token stops the trainer before it loads anything, with one line saying what to do —
and never the token."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.stub import Stubber

from llm_trainer.hub_token import hub_token
from llm_trainer.model import ModelNotLoaded
from tests.llm_trainer.test_trainer import job_for

TOKEN = "hf_abcdefghijklmnopqrstuvwxyz012345"
ROOT = Path(__file__).parents[2]


@pytest.fixture
def secrets(aws: None) -> Any:
    return boto3.client("secretsmanager")


@pytest.mark.parametrize(
    "value",
    [TOKEN, f" {TOKEN}\n", json.dumps({"HF_TOKEN": TOKEN, "user": "me"}), json.dumps({"t": TOKEN})],
)
def test_the_token_is_the_secret_or_its_hf_token_key(secrets: Any, value: str) -> None:
    secrets.create_secret(Name="teams/ml/hf-token", SecretString=value)
    assert hub_token("teams/ml/hf-token", secrets) == TOKEN


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("   ", "holds no token: put the Hugging Face access token in it"),
        (json.dumps({"a": TOKEN, "b": "x"}), "has keys ['a', 'b']: name the token's key HF_TOKEN"),
        (json.dumps({"HF_TOKEN": ""}), "holds no token"),
        ("{not json", "is not a JSON object or a token"),
    ],
)
def test_a_secret_without_a_token_says_so(secrets: Any, value: str, problem: str) -> None:
    secrets.create_secret(Name="hf-token", SecretString=value)
    with pytest.raises(ModelNotLoaded, match=re.escape(f"secret 'hf-token' {problem}")):
        hub_token("hf-token", secrets)


def test_a_missing_secret_says_how_to_make_it(secrets: Any) -> None:
    with pytest.raises(ModelNotLoaded) as raised:
        hub_token("hf-token", secrets)
    assert str(raised.value) == (
        "the Hugging Face token's secret 'hf-token' cannot be read (ResourceNotFoundException): "
        "create it in the deployment's region: aws secretsmanager create-secret --name hf-token "
        "--secret-string <your hf_… token>"
    )


@pytest.mark.parametrize(
    ("code", "fix"),
    [
        ("AccessDeniedException", "name it there and cdk deploy"),
        ("DecryptionFailure", "keep the default key (aws/secretsmanager)"),
    ],
)
def test_a_secret_the_pods_cannot_read_says_why(code: str, fix: str) -> None:
    """Errors GetSecretValue has (botocore's model lists DecryptionFailure; access denied is
    IAM's), answered through botocore's stubber."""
    client = boto3.client("secretsmanager", region_name="us-east-1")
    with Stubber(client) as stub:
        stub.add_client_error("get_secret_value", service_error_code=code)
        with pytest.raises(ModelNotLoaded, match=rf"\({code}\): .*{re.escape(fix)}"):
            hub_token("hf-token", client)


def test_a_secret_stored_as_binary_holds_no_token(secrets: Any) -> None:
    secrets.create_secret(Name="hf-token", SecretBinary=TOKEN.encode())
    with pytest.raises(ModelNotLoaded, match="secret 'hf-token' holds no token"):
        hub_token("hf-token", secrets)


def test_no_answer_at_all_is_said_by_its_cause() -> None:
    """Nothing listens where the client sends the request: botocore's own connection error."""
    client = boto3.client(
        "secretsmanager", region_name="us-east-1", endpoint_url="http://127.0.0.1:9",
        aws_access_key_id="none", aws_secret_access_key="none",
        config=Config(retries={"total_max_attempts": 1}),
    )  # fmt: skip
    with pytest.raises(ModelNotLoaded) as raised:
        hub_token("hf-token", client)
    assert str(raised.value) == (
        "the Hugging Face token's secret 'hf-token' cannot be read (EndpointConnectionError): "
        "check the secret in the deployment's region"
    )


def test_the_trainer_stops_before_loading_when_the_token_cannot_be_read(tmp_path: Path) -> None:
    """`python -m llm_trainer` on a job whose preset names a secret that cannot be read (no
    credentials reach Secrets Manager here): exit 2, one line naming the secret."""
    job = job_for().model_copy(update={"hub_token_secret": "hf-token"})
    done = subprocess.run(
        [sys.executable, "-m", "llm_trainer"],
        cwd=ROOT,
        env={
            "MTRL_TRAINING_JOB": job.model_dump_json(),
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",  # as the run's settings say (training_job.py)
            "AWS_ACCESS_KEY_ID": "none",
            "AWS_SECRET_ACCESS_KEY": "none",
            # Nowhere to send the request: the client's error, at once.
            "AWS_ENDPOINT_URL_SECRETS_MANAGER": "http://127.0.0.1:9",
            "AWS_MAX_ATTEMPTS": "1",
            "PATH": "/usr/bin:/bin",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainer: ")
    assert "'hf-token'" in lines[0]
