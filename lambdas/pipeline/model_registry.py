"""Every trained model in the deployment's SageMaker Model Registry group (Collect): the run's
best checkpoint as a model package version, pending manual approval, with the run's held-out
evaluation (`evaluation.json`) as its model-quality statistics, the run's execution as what
generated it, and the run, checkpoint and evaluation headline as metadata. One version per run:
the request's ClientToken is the run's id (SageMaker API reference, CreateModelPackage)."""

from __future__ import annotations

from typing import Any

from domain.evaluation import EvaluationReport

METADATA_LIMIT = 256  # a CustomerMetadataProperties value's length (SageMaker API reference)


def register_model(
    sagemaker: Any,
    *,
    group: str,
    run_id: str,
    config_name: str,
    checkpoint: str,
    evaluation: EvaluationReport,
    evaluation_uri: str,
    generated_by: str,
) -> str:
    """The model package's ARN."""
    metadata = {"mtrl:run_id": run_id, "mtrl:checkpoint": checkpoint[:METADATA_LIMIT]}
    if headline := evaluation.headline():
        metadata["mtrl:evaluation"] = headline[:METADATA_LIMIT]
    answer = sagemaker.create_model_package(
        ModelPackageGroupName=group,
        ModelPackageDescription=f"nova-mtrl run {run_id} ({config_name})",
        ModelApprovalStatus="PendingManualApproval",
        MetadataProperties={"GeneratedBy": generated_by},
        ModelMetrics={
            "ModelQuality": {
                "Statistics": {"ContentType": "application/json", "S3Uri": evaluation_uri}
            }
        },
        CustomerMetadataProperties=metadata,
        ClientToken=run_id,
    )
    return answer["ModelPackageArn"]
