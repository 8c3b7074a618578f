"""The managed multi-turn RL job (domain/serverless_job.py) against AWS's own code and models:
the job document equals what sagemaker-train 1.27.0's `MultiTurnRLTrainer` builds for the same
settings (its document methods and `FineTuningOptions`, run from its source by
tests/sagemaker_train_sdk.py, over AWS's published template parameters); a value is refused
exactly when the SDK refuses it; the CreateJob request is valid under botocore's SageMaker
model; `mtrl plan` prints both."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from botocore.session import get_session
from botocore.validate import ParamValidator
from pydantic import ValidationError

from domain.serverless_job import (
    HUB_MODELS,
    NOVA_TEMPLATE,
    OPEN_WEIGHTS_TEMPLATE,
    JobTargets,
    Mlflow,
    ServerlessRefused,
    create_job_request,
    hyperparameters,
    job_document,
    job_name,
    serverless_problems,
    template_for,
    template_parameters,
    value_problem,
)
from tests.sagemaker_train_sdk import fine_tuning_options, job_document_builder
from training_configs.schema import TrainingConfig, load_training_config

EXAMPLE = Path(__file__).parents[2] / "examples" / "wordle" / "serverless.yaml"
REGION, ACCOUNT = "us-east-1", "123456789012"
GROUPS = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:model-package-group/"
TARGETS = JobTargets(
    agent_lambda_arn=f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:mtrl-agent-rft",
    base_model_arn=(
        f"arn:aws:sagemaker:{REGION}:aws:hub-content/SageMakerPublicHub/Model/"
        "nova-textgeneration-lite-v2/1.0.0"
    ),
    train_uri="s3://mtrl-data/runs/r-0123456789/data/training.jsonl",
    output_uri="s3://mtrl-data/runs/r-0123456789/",
    output_model_package_group_arn=GROUPS + "mtrl-models",
    checkpoint_model_package_group_arn=GROUPS + "mtrl-checkpoints",
)
EVERYTHING = TARGETS.__class__(
    **{
        **TARGETS.__dict__,
        "validation_uri": "s3://mtrl-data/runs/r-0123456789/data/evaluation.jsonl",
        "kms_key_arn": f"arn:aws:kms:{REGION}:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab",
        "mlflow": Mlflow(
            app_arn=f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:mlflow-app/mtrl",
            experiment="wordle",
            run_name="r-0123456789",
        ),
        "accept_eula": True,
        "subnets": ("subnet-0123456789abcdef0",),
        "security_groups": ("sg-0123456789abcdef0",),
    }
)


def example(**changes: Any) -> TrainingConfig:
    config = load_training_config(EXAMPLE)
    return TrainingConfig.model_validate({**config.model_dump(exclude_none=True), **changes})


def sdk_document(config: TrainingConfig, targets: JobTargets) -> str:
    """What the SDK's `train` sends as JobConfigDocument for a trainer made with the same
    settings: hyperparameters set as a user sets them (`_apply_user_hyperparameters`: each
    through FineTuningOptions' checks) over the template's defaults (`_process_hyperparameters`
    snapshots them), in an account without a default MLflow app of its own."""
    options = fine_tuning_options()(template_parameters(template_for(config.model)))
    trainer = job_document_builder()()
    trainer._hp_defaults = options.to_dict().copy()
    for name, value in hyperparameters(config).items():
        setattr(options, name, value)
    vpc = (
        SimpleNamespace(
            security_group_ids=list(targets.security_groups), subnets=list(targets.subnets)
        )
        if targets.subnets
        else None
    )
    mlflow = targets.mlflow
    vars(trainer).update(
        agent_env=targets.agent_lambda_arn,
        bedrock_agentcore_qualifier="DEFAULT",
        training_dataset=targets.train_uri,
        validation_dataset=targets.validation_uri,
        s3_output_path=targets.output_uri,
        kms_key_arn=targets.kms_key_arn,
        output_model_package_group=targets.output_model_package_group_arn,
        intermediate_checkpoint_model_package_group=targets.checkpoint_model_package_group_arn,
        model=HUB_MODELS.get(config.model, config.model),
        _model_arn=targets.base_model_arn,
        mlflow_app_arn=mlflow.app_arn if mlflow else None,
        mlflow_experiment_name=mlflow.experiment if mlflow else None,
        mlflow_run_name=mlflow.run_name if mlflow else None,
        networking=vpc,
        accept_eula=targets.accept_eula,
        sagemaker_session=None,
        _final_hyperparameters=options.to_dict(),
    )
    return trainer._build_job_config_document()


def request(config: TrainingConfig, targets: JobTargets = TARGETS) -> dict[str, Any]:
    return create_job_request(
        config,
        targets,
        name=job_name("mtrl", "wordle-0123456789"),
        role_arn=f"arn:aws:iam::{ACCOUNT}:role/mtrl-agent-rft-job",
        tags={"mtrl-run": "wordle-0123456789"},
    )


CONFIGS = {
    "the example": example(),
    "every default": example(
        group_size=4, global_batch_size=128, max_steps=50, max_new_tokens=4096,
        rollout_timeout_seconds=600, reward_workers=6, rollout_concurrency=16,
        lora={"rank": 32, "alpha": 64}, serverless={},
    ),
    "every knob": example(
        group_size=16, global_batch_size=256, max_steps=1000, learning_rate=3e-6,
        clip_ratio=0.28, max_new_tokens=8192, max_length=16384, rollout_timeout_seconds=7200,
        reward_workers=3, rollout_concurrency=32, lora={"rank": 16, "alpha": 128},
        serverless={
            "loss_fn": "cispo", "advantage_method": "rloo", "temperature": 0.7,
            "sampling_top_p": 0.9, "max_steps_off_policy": 0, "rollout_max_retries": 10,
            "save_every": 0, "val_every": 25, "lora_plus_lr_ratio": 16.0,
            "adam_weight_decay": 0.01, "adam_grad_clip_norm": 1.0,
        },
    ),
    "an open-weights hub model": example(
        model="huggingface-reasoning-qwen3-32b", group_size=8, global_batch_size=512,
        lora={"rank": 64, "alpha": 128}, serverless={"temperature": 1.0},
    ),
}  # fmt: skip


@pytest.mark.parametrize("targets", [TARGETS, EVERYTHING], ids=["least", "everything"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_document_is_the_sdks_for_the_same_settings(name: str, targets: JobTargets) -> None:
    config = CONFIGS[name]
    assert serverless_problems(config) == []
    assert request(config, targets)["JobConfigDocument"] == sdk_document(config, targets)


def test_only_values_other_than_the_templates_defaults_are_sent() -> None:
    sent = json.loads(request(CONFIGS["the example"])["JobConfigDocument"])["TrainingConfig"]
    # 32 rollouts of groups of 4 are 8 prompts a step; groups of 4, ε 0.2 and LoRA 32/64 are
    # the template's own defaults; ppo its loss; 10 steps are not (its default is 50).
    assert sent["HyperParameters"] == {
        "global_batch_size": "8",
        "max_steps": "10",
        "sampling_max_tokens": "1024",
        "rollout_max_concurrency": "32",
    }
    assert (
        "HyperParameters"
        not in json.loads(request(CONFIGS["every default"])["JobConfigDocument"])["TrainingConfig"]
    )


def _probes(spec: dict[str, Any]) -> list[Any]:
    """Values on and around each bound of `spec`, its enum's members and a neighbour, and
    values of the wrong type."""
    numbers: list[Any] = [0, 1, -1, 2.5]
    for bound in (spec.get("min"), spec.get("max")):
        if bound is not None:
            numbers += [bound, bound - 1, bound + 1, math.nextafter(bound, math.inf)]
    for member in spec.get("enum", []):
        numbers += [member, member + 1] if isinstance(member, int) else [member, member + "x"]
    return [*numbers, "3", None]


@pytest.mark.parametrize("template", [NOVA_TEMPLATE, OPEN_WEIGHTS_TEMPLATE])
def test_a_value_is_refused_exactly_when_the_sdk_refuses_it(template: str) -> None:
    specs = template_parameters(template)
    options = fine_tuning_options()(specs)
    checked = 0
    for name, spec in specs.items():
        for value in _probes(spec):
            try:
                setattr(options, name, value)
                sdk_refuses = False
            except (ValueError, TypeError):
                sdk_refuses = True
            try:
                ours = value_problem(name, value, spec) is not None
            except TypeError:
                ours = True
            assert ours == sdk_refuses, (name, value)
            checked += 1
    assert checked > 300


def test_a_config_the_service_cannot_take_is_refused_with_every_reason_and_its_fix() -> None:
    config = example(
        recipe="RFT_MULTITURN_FULL", lora=None, kl_coefficient=0.1, global_batch_size=24,
        group_size=8, max_new_tokens=256, rollout_timeout_seconds=120, reward_workers=1,
        max_steps=2000, serverless={"temperature": 3.0}, base_checkpoint="run:wordle-0123456789",
    )  # fmt: skip
    problems = serverless_problems(config)
    assert problems == [
        "recipe RFT_MULTITURN_FULL: the managed job trains LoRA adapters only; use "
        "RFT_MULTITURN_LORA (or plane: hyperpod)",
        "kl_coefficient: the managed job's recipe has no KL term; set 0",
        "base_checkpoint: the managed job continues from a model package, which runs here "
        "cannot name yet; remove it",
        "global_batch_size / group_size (prompts a step) is 3: the managed job's "
        "global_batch_size must be one of 8, 16, 32, 64",
        "max_steps is 2000: the managed job's max_steps must be <= 1000",
        "max_new_tokens is 256: the managed job's sampling_max_tokens must be >= 512",
        "rollout_timeout_seconds is 120: the managed job's rollout_timeout must be >= 300",
        "reward_workers x rollout_concurrency (episodes in flight) is 16: the managed job's "
        "rollout_max_concurrency must be >= 32",
        "serverless.temperature is 3.0: the managed job's temperature must be <= 2",
    ]
    with pytest.raises(ServerlessRefused) as refused:
        job_document(config, TARGETS)
    assert all(problem in str(refused.value) for problem in problems)


def test_a_knob_only_nova_has_is_refused_for_another_model() -> None:
    config = example(model="huggingface-reasoning-qwen3-32b", global_batch_size=256,
                     serverless={"lora_plus_lr_ratio": 8.0})  # fmt: skip
    assert serverless_problems(config) == [
        "serverless.lora_plus_lr_ratio: mtrl_lora has no lora_plus_lr_ratio; remove it"
    ]


def test_a_model_the_hub_cannot_name_is_refused() -> None:
    (problem,) = serverless_problems(example(model="Qwen/Qwen3-0.6B"))
    assert problem.startswith("model 'Qwen/Qwen3-0.6B': the managed job trains a model of")


def test_the_request_is_valid_under_botocores_sagemaker_model() -> None:
    shape = get_session().get_service_model("sagemaker").operation_model("CreateJob").input_shape
    for config in CONFIGS.values():
        made = request(config, EVERYTHING)
        report = ParamValidator().validate(made, shape)
        assert not report.has_errors(), report.generate_report()
        assert made["JobCategory"] in shape.members["JobCategory"].enum


def test_a_long_run_id_keeps_its_digest_in_the_job_name() -> None:
    shape = get_session().get_service_model("sagemaker").operation_model("CreateJob").input_shape
    run_id = "a-dataset-name-of-forty-characters-long-0123456789"
    name = job_name("a-long-deployment-prefix", run_id)
    assert len(name) == 63 and name.endswith("-0123456789")
    assert (
        not ParamValidator().validate({**request(example()), "JobName": name}, shape).has_errors()
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"plane": "hyperpod", "serverless": {}},
         "instance_type, instance_count, generation_replicas: a hyperpod run needs them"),
        ({"instance_count": 8}, "instance_count: a serverless run has no instances to choose"),
        ({"plane": "hyperpod", "instance_type": "ml.p5.48xlarge", "instance_count": 8,
          "generation_replicas": 2}, "serverless: its knobs are for plane: serverless"),
    ],
)  # fmt: skip
def test_the_plane_decides_whether_a_config_chooses_instances(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        example(**changes)
