"""A real MLflow tracking server for the tests: MLflow's own server application (the Flask app
`mlflow server` serves its REST API with) on 127.0.0.1 (tests/loopback_server.py), with a SQLite
store and the artifact root given.

What it cannot be is SageMaker's: it checks no SigV4 signature and no IAM action; those are the
fake's (tests/mlflow_fake.py), held to SageMaker's and AWS's plugin's shapes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mlflow.server.constants import ARTIFACT_ROOT_ENV_VAR, BACKEND_STORE_URI_ENV_VAR

from tests.loopback_server import loopback_server


@contextmanager
def mlflow_server(directory: Path, *, artifact_root: str) -> Iterator[str]:
    """The server's URL while the block runs (its store and log in `directory`)."""
    environment = {
        BACKEND_STORE_URI_ENV_VAR: f"sqlite:///{directory / 'mlflow.db'}",
        ARTIFACT_ROOT_ENV_VAR: artifact_root,
    }
    script = "from mlflow.server import app\nserve(app)\n"
    with loopback_server(script, directory, kind="wsgi", environment=environment) as url:
        yield url
