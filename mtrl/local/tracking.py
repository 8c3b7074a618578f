"""Local runs in MLflow: a SQLite tracking store under the output folder (`<out>/mlflow.db`,
artifacts in `<out>/mlflow-artifacts/`), so `mlflow ui --backend-store-uri sqlite:///<out>/mlflow.db`
shows every local run side by side.

SQLite, not MLflow's `./mlruns` folder: since MLflow 3.7 the database is MLflow's default and
the folder store is in maintenance mode (MLflow docs, "Backend Stores"; 3.18 refuses it unless
MLFLOW_ALLOW_FILE_STORE is set). MLflow is optional (`pip install 'nova-mtrl[tracking]'`):
without it the run is unchanged and the report says why nothing was tracked.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from domain.tracking import EXPERIMENT, TrackedRun

STORE = "mlflow.db"
ARTIFACTS = "mlflow-artifacts"

log = logging.getLogger("mtrl.tracking")


class TrackingUnavailable(RuntimeError):
    """MLflow is not installed (or cannot open its store); the message says what to do."""


def store_uri(out_dir: Path) -> str:
    return f"sqlite:///{(out_dir / STORE).resolve()}"


def open_store(out_dir: Path) -> Any:
    """The output folder's MLflow store, ready (an MlflowClient): MLflow imported and, the first
    time, the store's schema made — seconds that `run_local` spends while the run goes on."""
    # A local run is offline: MLflow's usage telemetry, on by default and started by its import
    # (requests to MLflow's servers), stays off unless the user set MLFLOW_DISABLE_TELEMETRY.
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    try:
        from mlflow.tracking import MlflowClient
    except ImportError as missing:
        raise TrackingUnavailable(
            f"MLflow is not installed ({missing.name}); `pip install 'nova-mtrl[tracking]'` "
            "tracks local runs"
        ) from None
    # Set after MLflow's import configures its loggers: its store set-up notes are not news.
    for chatty in ("mlflow", "alembic"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    out_dir.mkdir(parents=True, exist_ok=True)
    client = MlflowClient(tracking_uri=store_uri(out_dir))
    client.get_experiment_by_name(EXPERIMENT)  # the store made now, not when the run is logged
    return client


def track_locally(run: TrackedRun, out_dir: Path, *, store: Any | None = None) -> str:
    """Log the run to the output folder's MLflow store (`store`: it, already opened by
    `open_store`); its MLflow run id."""
    client = store if store is not None else open_store(out_dir)
    from mlflow.entities import Metric, Param, RunTag

    experiment = client.get_experiment_by_name(EXPERIMENT)
    experiment_id = (
        experiment.experiment_id
        if experiment is not None
        else client.create_experiment(
            EXPERIMENT, artifact_location=(out_dir / ARTIFACTS).resolve().as_uri()
        )
    )
    created = client.create_run(experiment_id, run_name=run.run_name)
    run_id = created.info.run_id
    for metrics, params, tags in run.batches():
        client.log_batch(
            run_id,
            metrics=[Metric(m.key, m.value, m.timestamp_ms, m.step) for m in metrics],
            params=[Param(key, value) for key, value in params.items()],
            tags=[RunTag(key, value) for key, value in tags.items()],
        )
    with tempfile.TemporaryDirectory() as folder:
        for name, content in run.artifacts.items():
            path = Path(folder) / name
            path.write_bytes(content)
            client.log_artifact(run_id, str(path))
    client.set_terminated(run_id, status=run.status)
    return run_id
