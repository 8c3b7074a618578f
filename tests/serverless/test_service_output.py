"""What the service adds to a described job (`JobConfigDocument.ServiceOutput`) read as the SDK's
`AgentRFTJob` reads it — its readers compiled from sagemaker-train 1.27.0's source are the
oracle — and the plane's use of it: the trained model's package, which Collect records."""

from __future__ import annotations

import json
import types
from typing import Any

import pytest

from domain.serverless_job import service_output
from tests.sagemaker_train_sdk import agent_rft_job_reader

PACKAGE = "arn:aws:sagemaker:us-east-1:123456789012:model-package/nova-mtrl-models/4"
DOCUMENTS = {
    "not started": {"AgentConfig": {"CustomAgentLambdaConfig": {"LambdaArn": "arn"}}},
    "training": {"ServiceOutput": {
        "ProgressInfo": {"MaxSteps": 10, "CurrentStep": 3},
        "MlflowDetails": {"ExperimentName": "e", "RunName": "r", "ExperimentId": "1", "RunId": "9"},
        "RolloutInfo": {"Total": 320, "Completed": 96},
    }},
    "by epoch": {"ServiceOutput": {
        "ProgressInfo": {"MaxEpoch": 2, "StepsPerEpoch": 5, "CurrentEpoch": 1, "CurrentStep": 7},
    }},
    "no bound on progress": {"ServiceOutput": {"ProgressInfo": {"CurrentStep": 7}}},
    "completed": {"ServiceOutput": {
        "OutputModelPackageArn": PACKAGE,
        "BillableTokenUsage": {"TrainTokenCount": 1200, "PrefillTokenCount": 300,
                               "SampleTokenCount": 900},
        "ProgressInfo": {"MaxSteps": 10, "CurrentStep": 10},
    }},
    "empty service output": {"ServiceOutput": {}},
}  # fmt: skip


def sdk_read(document: dict[str, Any] | None) -> Any:
    reader = agent_rft_job_reader()()
    reader._job = types.SimpleNamespace(
        job_config_document=json.dumps(document) if document is not None else None
    )
    reader._cached_config = None
    return reader


@pytest.mark.parametrize("name", [*DOCUMENTS, "no document"])
def test_the_service_output_is_read_as_the_sdk_reads_it(name: str) -> None:
    document = DOCUMENTS.get(name)
    described = {"JobConfigDocument": json.dumps(document)} if document is not None else {}
    ours, sdks = service_output(described), sdk_read(document)
    assert ours.output_model_package_arn == sdks.output_model_package_arn
    assert ours.mlflow_details == sdks.mlflow_details
    assert ours.billable_token_usage == sdks.billable_token_usage
    assert ours.progress == sdks.progress_info
