"""A serverless run's held-out evaluation job (domain/serverless_job.py) against AWS's own code:
its document equals what sagemaker-train 1.27.0's `MultiTurnRLEvaluator` builds for the same
settings (`_build_template_context`, run from its source by tests/sagemaker_train_sdk.py), the
base model's and a trained package's; its hyperparameters are the SDK's for a user who sets
`eval_group_size`, over AWS's published evaluation recipe parameters; the CreateJob request is
valid under botocore's SageMaker model; the run's job names stay within CreateJob's limit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from botocore.session import get_session
from botocore.validate import ParamValidator

from domain.episodes import EvaluationStage
from domain.serverless_job import (
    EVALUATION_PARAMETERS_FILE,
    EVALUATION_TEMPLATE,
    EvaluationTargets,
    create_evaluation_request,
    evaluation_hyperparameters,
    job_name,
    run_job_names,
    template_parameters,
)
from tests.sagemaker_train_sdk import (
    evaluation_document_builder,
    fine_tuning_options,
    flatten_resolved_recipe,
)
from training_configs.schema import TrainingConfig, load_training_config

EXAMPLE = Path(__file__).parents[2] / "examples" / "wordle" / "serverless.yaml"
REGION, ACCOUNT = "us-east-1", "123456789012"
BASE = EvaluationTargets(
    agent_lambda_arn=f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:mtrl-agent-rft",
    base_model_arn=(
        f"arn:aws:sagemaker:{REGION}:aws:hub-content/SageMakerPublicHub/Model/"
        "nova-textgeneration-lite-v2/1.0.0"
    ),
    evaluation_uri="s3://mtrl-data/runs/r-0123456789/data/evaluation.jsonl",
    output_uri="s3://mtrl-data/runs/r-0123456789/evaluation/baseline/",
)
TRAINED = EvaluationTargets(
    **{
        **BASE.__dict__,
        "output_uri": "s3://mtrl-data/runs/r-0123456789/evaluation/final/",
        "kms_key_arn": f"arn:aws:kms:{REGION}:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab",
        "model_package_arn": f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:model-package/mtrl-models/3",
        "max_runtime_seconds": 43_200,
    }
)


def example(**changes: Any) -> TrainingConfig:
    config = load_training_config(EXAMPLE)
    return TrainingConfig.model_validate({**config.model_dump(exclude_none=True), **changes})


def sdk_hyperparameters(config: TrainingConfig) -> dict[str, Any]:
    """The evaluator's effective hyperparameters (`_get_effective_hyperparameters`) for a user
    who sets `evaluator.hyperparameters.eval_group_size` (checked by FineTuningOptions over the
    hub's spec, here AWS's published one): the user-set value over the spec's defaults in the
    recipe's `inference` section (`get_resolved_recipe_from_context`; its RecipeResolver needs
    omegaconf, so this merge is ours), flattened by the SDK's own `flatten_resolved_recipe`."""
    options = fine_tuning_options()(
        template_parameters(EVALUATION_TEMPLATE, EVALUATION_PARAMETERS_FILE)
    )
    options.eval_group_size = config.eval_samples
    resolved = {"inference": {name: getattr(options, name) for name in options._specs}}
    return flatten_resolved_recipe()(resolved)


def sdk_document(config: TrainingConfig, targets: EvaluationTargets) -> str:
    """The JobConfigDocument the SDK's evaluator puts in its pipeline's evaluation step for an
    evaluator of the same model, agent (a Lambda), dataset and output, in an account without an
    MLflow app: the fine-tuned step's when a package is evaluated."""
    evaluator = evaluation_document_builder()()
    effective = sdk_hyperparameters(config)
    vars(evaluator).update(
        _get_effective_hyperparameters=lambda: effective,
        _agent_arn_resolved=targets.agent_lambda_arn,
        _agent_kind="lambda",
        agent_qualifier=None,
        dataset=targets.evaluation_uri,
        s3_output_path=targets.output_uri,
        kms_key_id=targets.kms_key_arn,
        mlflow_resource_arn=None,
        mlflow_experiment_name=None,
        _base_model_name_cache="nova-textgeneration-lite-v2",
        _base_model_arn_cache=targets.base_model_arn,
        _base_model_arn=targets.base_model_arn,
        _source_model_package_arn_cache=targets.model_package_arn,
        stopping_condition=targets.max_runtime_seconds,
        tags=None,
        networking=None,
    )
    context = evaluator._build_template_context(
        {"region": REGION, "account_id": ACCOUNT, "role_arn": "arn:aws:iam::1:role/r"}, {}, None
    )
    return context[
        "job_config_document_ft_str" if targets.model_package_arn else "job_config_document_str"
    ]


def request(config: TrainingConfig, targets: EvaluationTargets) -> dict[str, Any]:
    stage = EvaluationStage.FINAL if targets.model_package_arn else EvaluationStage.BASELINE
    return create_evaluation_request(
        config,
        targets,
        name=job_name("mtrl", "wordle-0123456789", stage),
        role_arn=f"arn:aws:iam::{ACCOUNT}:role/mtrl-agent-rft-job",
        tags={"mtrl-run": "wordle-0123456789"},
    )


@pytest.mark.parametrize("targets", [BASE, TRAINED], ids=["base model", "trained package"])
@pytest.mark.parametrize("samples", [1, 4, 64])
def test_the_document_is_the_sdk_evaluators_for_the_same_settings(
    targets: EvaluationTargets, samples: int
) -> None:
    config = example(eval_samples=samples)
    assert request(config, targets)["JobConfigDocument"] == sdk_document(config, targets)


def test_the_hyperparameters_are_the_k_of_pass_at_k_and_the_recipes_success_threshold() -> None:
    """The sampling values are not sent (the recipe names them otherwise than the SDK reads
    them), nor the list of k (the SDK's flattening drops lists): the service keeps its own."""
    assert evaluation_hyperparameters(example(eval_samples=8)) == {
        "eval_group_size": "8",
        "success_threshold": "1.0",
    }
    document = json.loads(request(example(), TRAINED)["JobConfigDocument"])
    assert document["EvaluationConfig"] == {
        "BaseModelArn": BASE.base_model_arn,
        "AcceptEula": True,
        "HyperParameters": {"eval_group_size": "4", "success_threshold": "1.0"},
    }
    assert document["ModelPackageConfig"] == {"InputModelPackageArn": TRAINED.model_package_arn}


def test_the_request_is_valid_under_botocores_sagemaker_model() -> None:
    shape = get_session().get_service_model("sagemaker").operation_model("CreateJob").input_shape
    for targets in (BASE, TRAINED):
        made = request(example(), targets)
        report = ParamValidator().validate(made, shape)
        assert not report.has_errors(), report.generate_report()
        assert made["JobCategory"] == "AgentRFTEvaluation"
        assert made["JobCategory"] in shape.members["JobCategory"].enum


def test_a_runs_jobs_are_named_apart_within_createjobs_limit() -> None:
    run_id = "a-dataset-name-of-forty-characters-long-0123456789"
    names = run_job_names("a-long-deployment-prefix", run_id)
    assert len(set(names)) == 3 and all(len(name) <= 63 for name in names)
    training, baseline, final = names
    assert training.endswith("-0123456789")
    assert (baseline, final) == (
        f"{training.removesuffix('-0123456789')[: 63 - 20].rstrip('-')}-0123456789-baseline",
        f"{training.removesuffix('-0123456789')[: 63 - 17].rstrip('-')}-0123456789-final",
    )
    short = run_job_names("mtrl", "wordle-0123456789")
    assert short == (
        "mtrl-run-wordle-0123456789",
        "mtrl-run-wordle-0123456789-baseline",
        "mtrl-run-wordle-0123456789-final",
    )
