"""SageMaker's managed multi-turn RL job (the serverless plane) as AWS's SDK submits it: the
CreateJob request, its job document, and the hyperparameters a training config sets in it.

Sources (each pinned by tests/serverless/test_job_document.py, which runs the SDK's own code):
- the request and its document: sagemaker-train 1.27.0, `MultiTurnRLTrainer`
  (multi_turn_rl_trainer.py): `train` calls CreateJob with JobCategory `AgentRFT`, schema
  version "1.0.0" and the JumpStart tags (utils.py `_get_jumpstart_tags`); `_build_job_config`
  and its `_build_*` methods make the document;
- the hyperparameters: AWS's MTRL recipe template parameters (aws/sagemaker-hyperpod-recipes
  2631995, launcher/recipe_templatization/mtrl/mtrl_recipe_template_parameters.json, shipped
  unchanged as training_configs/mtrl_recipe_template_parameters.json): each one's type, range and
  default. The SDK checks a value against them (common.py `FineTuningOptions`) and sends, as
  strings, only the values that differ from the default (`_build_training_config`). The SDK
  reads these from the hub at run time (`_get_fine_tuning_options_and_model_arn`); that the
  hub's equal the published file is unverified;
- the models: the hub `SageMakerPublicHub`; Nova 2 Lite is `nova-textgeneration-lite-v2` there
  (common_utils/model_aliases.py); MTRL trains LoRA only (the trainer asks the hub for "LORA");
- a held-out evaluation (JobCategory `AgentRFTEvaluation`): the SDK's `MultiTurnRLEvaluator`
  (evaluate/multi_turn_rl_evaluator.py `_build_template_context`, the document of its
  pipeline's Job step; evaluate/mtrl_pipeline_templates.py: category, schema "1.0.0") and AWS's
  MTRL evaluation recipe parameters (the same commit,
  launcher/recipe_templatization/mtrl_eval/mtrl_eval_recipe_template_parameters.json, shipped
  unchanged as training_configs/mtrl_eval_recipe_template_parameters.json).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from domain.agent_rft import EVALUATION_CATEGORY, JOB_CATEGORY
from domain.episodes import EvaluationStage
from domain.naming import run_resource_name
from training_configs.schema import GrpoSettings, NovaRecipeSettings, TrainingConfig

JOB_CONFIG_SCHEMA_VERSION = "1.0.0"
# Where a job logs: `/aws/sagemaker/Job/AgentRFT` (the docs); an evaluation's, by the same rule,
# `/aws/sagemaker/Job/AgentRFTEvaluation` (unverified).
LOG_GROUPS = tuple(f"/aws/sagemaker/Job/{c}" for c in (JOB_CATEGORY, EVALUATION_CATEGORY))
HUB_NAME = "SageMakerPublicHub"
# Our model names → the hub's, for the models whose MTRL recipe AWS publishes.
HUB_MODELS = {"nova-lite-2": "nova-textgeneration-lite-v2"}
# Which of AWS's templates a model's hyperparameters follow (a hub model other than Nova's:
# `mtrl_lora`, the open-weights models' template).
NOVA_TEMPLATE, OPEN_WEIGHTS_TEMPLATE = "mtrl_nova_lite_lora", "mtrl_lora"
PARAMETERS_FILE = "mtrl_recipe_template_parameters.json"
EVALUATION_PARAMETERS_FILE, EVALUATION_TEMPLATE = (
    "mtrl_eval_recipe_template_parameters.json",
    "mtrl_eval",
)
# The hyperparameters the SDK's evaluator puts in a document, by the names it reads them with
# (`_build_job_config_doc`); it sends those its resolved hyperparameters have.
EVALUATION_HYPERPARAMETERS = (
    "eval_group_size", "sampling_temperature", "top_p", "max_tokens", "pass_k_values",
    "success_threshold",
)  # fmt: skip
# An evaluation job's StoppingCondition.MaxRuntimeInSeconds at most (the SDK's check: 72 hours).
EVALUATION_MAX_SECONDS = 259_200
# A hub content name (botocore's DescribeHubContent HubContentName pattern).
HUB_CONTENT_NAME = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")
# CreateJob's JobName (botocore's sagemaker model).
JOB_NAME_LIMIT = 63
# The tags the SDK puts on every job it creates (`_get_jumpstart_tags`).
JUMPSTART_MODEL_TAG = "sagemaker-sdk:jumpstart-model-id"
JUMPSTART_HUB_TAG = "sagemaker-sdk:jumpstart-hub-name"


# Where a serverless config trains, and what to do when a deployment lacks it (Register, planes).
NO_SERVERLESS_PLANE = (
    "runs as SageMaker's managed job, and this deployment has no serverless plane "
    "(serverless_training: false); deploy it with serverless_training: true, or set plane: "
    "hyperpod (`mtrl plan --config` shows the job it would submit)"
)


class ServerlessRefused(ValueError):
    """A config the managed job cannot take; the text says each reason and its fix."""


class ServiceOutput(BaseModel):
    """What the service adds to a job's document as DescribeJob answers it
    (`JobConfigDocument.ServiceOutput`), as the SDK's `AgentRFTJob` reads it: the trained
    model's package, the job's MLflow run, the tokens billed, its progress."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    output_model_package_arn: str | None = Field(default=None, alias="OutputModelPackageArn")
    # ExperimentName, RunName, ExperimentId, RunId.
    mlflow_details: dict[str, Any] | None = Field(default=None, alias="MlflowDetails")
    # TrainTokenCount, PrefillTokenCount, SampleTokenCount.
    billable_token_usage: dict[str, Any] | None = Field(default=None, alias="BillableTokenUsage")
    # {MaxSteps, CurrentStep}, or by epoch {MaxEpoch, StepsPerEpoch, CurrentEpoch, CurrentStep}.
    progress_info: dict[str, Any] | None = Field(default=None, alias="ProgressInfo")

    @property
    def progress(self) -> dict[str, Any] | None:
        """The progress, where it says how far the job goes (the SDK's `progress_info`)."""
        info = self.progress_info
        if not info:
            return None
        by_epoch = info.get("MaxEpoch") and info.get("StepsPerEpoch")
        return info if by_epoch or info.get("MaxSteps") else None


def service_output(described: dict[str, Any]) -> ServiceOutput:
    """The service's output of a job DescribeJob answered with (empty before it has any)."""
    document = described.get("JobConfigDocument")
    return ServiceOutput.model_validate(
        (json.loads(document) if document else {}).get("ServiceOutput") or {}
    )


@cache
def template_parameters(
    template: str, parameters_file: str = PARAMETERS_FILE
) -> dict[str, dict[str, Any]]:
    """AWS's hyperparameters of `template`: name → {type, min, max, enum, default}."""
    text = resources.files("training_configs").joinpath(parameters_file).read_text("utf-8")
    return json.loads(text)["templates"][template]["recipe_override_parameters"]


def hub_model(model: str) -> str:
    """The hub content name of `model` (one of HUB_MODELS, or a hub name as it is)."""
    return HUB_MODELS.get(model, model)


def template_for(model: str) -> str:
    return NOVA_TEMPLATE if "nova" in hub_model(model).lower() else OPEN_WEIGHTS_TEMPLATE


# Where each hyperparameter comes from in a training config, for the messages.
SOURCES = {
    "global_batch_size": "global_batch_size / group_size (prompts a step)",
    "group_size": "group_size",
    "max_steps": "max_steps",
    "learning_rate": "learning_rate",
    "clip_low_threshold": "1 - clip_ratio",
    "clip_high_threshold": "1 + clip_ratio",
    "sampling_max_tokens": "max_new_tokens",
    "rollout_timeout": "rollout_timeout_seconds",
    "rollout_max_concurrency": "reward_workers x rollout_concurrency (episodes in flight)",
    "lora_rank": "lora.rank",
    "lora_alpha": "lora.alpha",
}


def hyperparameters(config: TrainingConfig) -> dict[str, Any]:
    """The template's hyperparameters `config` sets, by name, typed as the SDK takes them."""
    chosen: dict[str, Any] = {
        # AWS's batch is prompts a step (the recipe's `training_batch_size`); ours, rollouts.
        "global_batch_size": config.global_batch_size // config.group_size,
        "group_size": config.group_size,
        "max_steps": config.max_steps,
        "learning_rate": config.learning_rate,
        # The ratio's band [1 - ε, 1 + ε], as the recipe's thresholds bound it (0.8, 1.2).
        "clip_low_threshold": round(1 - config.clip_ratio, 6),
        "clip_high_threshold": round(1 + config.clip_ratio, 6),
        "sampling_max_tokens": config.max_new_tokens,
        "rollout_timeout": config.rollout_timeout_seconds,
        "rollout_max_concurrency": config.reward_workers * config.rollout_concurrency,
    }
    if config.lora is not None:
        chosen |= {"lora_rank": config.lora.rank, "lora_alpha": config.lora.alpha}
    return chosen | config.serverless.chosen()


def value_problem(name: str, value: Any, spec: dict[str, Any]) -> str | None:
    """Why the SDK refuses `value` for `name` under `spec` (its `_validate_value`), or None."""
    kind = spec.get("type")
    if kind == "float" and not isinstance(value, int | float):
        return f"{name} must be a number"
    if kind == "integer" and not isinstance(value, int):
        return f"{name} must be an integer"
    if kind == "string" and not isinstance(value, str):
        return f"{name} must be a string"
    if "min" in spec and value < spec["min"]:
        return f"{name} must be >= {spec['min']}"
    if "max" in spec and value > spec["max"]:
        return f"{name} must be <= {spec['max']}"
    if "enum" in spec and value not in spec["enum"]:
        return f"{name} must be one of {', '.join(map(str, spec['enum']))}"
    return None


def serverless_problems(config: TrainingConfig) -> list[str]:
    """What in `config` the managed job cannot take, each with its fix (empty: none)."""
    model = hub_model(config.model)
    if not HUB_CONTENT_NAME.fullmatch(model):
        return [
            f"model {config.model!r}: the managed job trains a model of SageMaker's hub, named "
            f"as the hub names it (e.g. {', '.join(HUB_MODELS)} or a hub content name such as "
            "huggingface-reasoning-qwen3-32b)"
        ]
    problems = []
    if config.recipe != "RFT_MULTITURN_LORA":
        problems.append(
            f"recipe {config.recipe}: the managed job trains LoRA adapters only; use "
            "RFT_MULTITURN_LORA (or plane: hyperpod)"
        )
    if config.kl_coefficient:
        problems.append("kl_coefficient: the managed job's recipe has no KL term; set 0")
    if config.base_checkpoint is not None:
        problems.append(
            "base_checkpoint: the managed job continues from a model package, which runs here "
            "cannot name yet; remove it"
        )
    if config.nova != NovaRecipeSettings():
        problems.append("nova: Nova's HyperPod recipe knobs; use serverless: for the managed job")
    if config.grpo != GrpoSettings():
        problems.append("grpo: the open-weights trainer's settings; use serverless: instead")
    specs = template_parameters(template_for(config.model))
    for name, value in hyperparameters(config).items():
        source = SOURCES.get(name, f"serverless.{name}")
        if name not in specs:
            problems.append(f"{source}: {template_for(config.model)} has no {name}; remove it")
        elif problem := value_problem(name, value, specs[name]):
            problems.append(f"{source} is {value}: the managed job's {problem}")
    return problems


def sent_hyperparameters(config: TrainingConfig) -> dict[str, str]:
    """The hyperparameters the document carries: each set value that differs from the
    template's default, as a string (what the SDK sends)."""
    specs = template_parameters(template_for(config.model))
    chosen = hyperparameters(config)
    return {  # in the template's order, as the SDK lists them
        name: str(chosen[name])
        for name, spec in specs.items()
        if name in chosen and str(chosen[name]) != str(spec.get("default"))
    }


def job_name(prefix: str, run_id: str, stage: EvaluationStage | None = None) -> str:
    """The run's job: `<prefix>-run-<run id>`, and its evaluation of `stage`
    `<prefix>-run-<run id>-<stage>`, its middle cut to CreateJob's 63 characters so that the run
    id's digest and the stage stay whole."""
    name, suffix = run_resource_name(prefix, run_id).replace("_", "-"), f"-{stage}" if stage else ""
    if len(name) + len(suffix) <= JOB_NAME_LIMIT:
        return name + suffix
    tail = f"-{run_id.rpartition('-')[2]}{suffix}"
    return f"{name[: JOB_NAME_LIMIT - len(tail)].rstrip('-')}{tail}"


def run_jobs(prefix: str, run_id: str) -> tuple[tuple[str, str], ...]:
    """Every managed job a serverless run may start, as (name, JobCategory): its training and
    its evaluations."""
    evaluations = [(job_name(prefix, run_id, s), EVALUATION_CATEGORY) for s in EvaluationStage]
    return ((job_name(prefix, run_id), JOB_CATEGORY), *evaluations)


def run_job_names(prefix: str, run_id: str) -> tuple[str, ...]:
    return tuple(name for name, _ in run_jobs(prefix, run_id))


@dataclass(frozen=True)
class Mlflow:
    app_arn: str
    experiment: str | None = None
    run_name: str | None = None


@dataclass(frozen=True)
class JobTargets:
    """What a run gives its job: the agent, the data, where results go."""

    agent_lambda_arn: str
    base_model_arn: str
    train_uri: str
    output_uri: str
    output_model_package_group_arn: str
    checkpoint_model_package_group_arn: str
    validation_uri: str | None = None
    kms_key_arn: str | None = None
    mlflow: Mlflow | None = None
    # A gated model's licence, accepted by the operator (the SDK refuses a gated model without).
    accept_eula: bool = False
    subnets: tuple[str, ...] = ()
    security_groups: tuple[str, ...] = ()


def _channel(name: str, uri: str) -> dict[str, Any]:
    return {
        "ChannelName": name,
        "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": uri}},
    }


def job_document(config: TrainingConfig, targets: JobTargets) -> dict[str, Any]:
    """The job's configuration document (schema 1.0.0), as the SDK builds it for the same
    settings. ServerlessRefused: `serverless_problems`, all at once."""
    if problems := serverless_problems(config):
        raise ServerlessRefused(
            f"config {config.name!r} cannot run as SageMaker's managed job:\n  - "
            + "\n  - ".join(problems)
        )
    channels = [_channel("train", targets.train_uri)]
    if targets.validation_uri is not None:
        channels.append(_channel("validation", targets.validation_uri))
    output: dict[str, Any] = {"S3OutputPath": targets.output_uri}
    if targets.kms_key_arn:
        output["KmsKeyArn"] = targets.kms_key_arn
    training: dict[str, Any] = {"BaseModelArn": targets.base_model_arn}
    if targets.mlflow is not None:
        mlflow = {"MlflowResourceArn": targets.mlflow.app_arn}
        if targets.mlflow.experiment:
            mlflow["MlflowExperimentName"] = targets.mlflow.experiment
        if targets.mlflow.run_name:
            mlflow["MlflowRunName"] = targets.mlflow.run_name
        training["MlflowConfig"] = mlflow
    training["AcceptEula"] = targets.accept_eula  # the SDK sends it always
    if sent := sent_hyperparameters(config):
        training["HyperParameters"] = sent
    document: dict[str, Any] = {
        "AgentConfig": {"CustomAgentLambdaConfig": {"LambdaArn": targets.agent_lambda_arn}},
        "InputDataConfig": channels,
        "OutputDataConfig": output,
        "ModelPackageConfig": {
            "OutputModelPackageGroupArn": targets.output_model_package_group_arn,
            "IntermediateCheckpointModelPackageGroupArn": (
                targets.checkpoint_model_package_group_arn
            ),
        },
        "TrainingConfig": training,
    }
    if targets.subnets:
        document["VpcConfig"] = {
            "SecurityGroupIds": list(targets.security_groups),
            "Subnets": list(targets.subnets),
        }
    return document


def create_job_request(
    config: TrainingConfig,
    targets: JobTargets,
    *,
    name: str,
    role_arn: str,
    tags: dict[str, str] | None = None,
) -> dict[str, Any]:
    """CreateJob's parameters for the run's job (the SDK's, plus the run's own tags)."""
    jumpstart = {JUMPSTART_MODEL_TAG: hub_model(config.model), JUMPSTART_HUB_TAG: HUB_NAME}
    return {
        "JobName": name,
        "RoleArn": role_arn,
        "JobCategory": JOB_CATEGORY,
        "JobConfigSchemaVersion": JOB_CONFIG_SCHEMA_VERSION,
        "JobConfigDocument": json.dumps(job_document(config, targets), indent=2),
        "Tags": [{"Key": k, "Value": v} for k, v in (jumpstart | (tags or {})).items()],
    }


@dataclass(frozen=True)
class EvaluationTargets:
    """What a run gives a held-out evaluation job: the agent, the model, its records."""

    agent_lambda_arn: str
    base_model_arn: str
    evaluation_uri: str
    output_uri: str
    kms_key_arn: str | None = None
    # The trained model's package (the final evaluation); None evaluates the base model.
    model_package_arn: str | None = None
    max_runtime_seconds: int = 86_400  # the SDK's default


def evaluation_defaults() -> dict[str, Any]:
    """AWS's MTRL evaluation recipe's values, by parameter name."""
    specs = template_parameters(EVALUATION_TEMPLATE, EVALUATION_PARAMETERS_FILE)
    return {name: spec.get("default") for name, spec in specs.items()}


def evaluation_hyperparameters(config: TrainingConfig) -> dict[str, str]:
    """The evaluation's hyperparameters as the SDK sends them when a user sets
    `eval_group_size` (the k of pass@k, our `eval_samples`): the recipe's values with that one
    set (common_utils/recipe_utils.py `get_resolved_recipe_from_context`), flattened to their
    scalars (recipe_resolver.py `flatten_resolved_recipe` drops a list: `pass_k_values`), of the
    names the evaluator puts in its document (the recipe's `temperature`, `sampling_top_p` and
    `sampling_max_tokens` are not the names it reads: the service keeps their defaults)."""
    resolved = evaluation_defaults() | {"eval_group_size": config.eval_samples}
    return {
        name: str(resolved[name])
        for name in EVALUATION_HYPERPARAMETERS
        if name in resolved and not isinstance(resolved[name], list)
    }


def evaluation_document(config: TrainingConfig, targets: EvaluationTargets) -> dict[str, Any]:
    """A held-out evaluation job's document, as the SDK's evaluator builds it: the base model,
    or (with `model_package_arn`) the trained one, on the `evaluation` channel."""
    output: dict[str, Any] = {"S3OutputPath": targets.output_uri}
    if targets.kms_key_arn:
        output["KmsKeyArn"] = targets.kms_key_arn
    evaluation: dict[str, Any] = {"BaseModelArn": targets.base_model_arn, "AcceptEula": True}
    if sent := evaluation_hyperparameters(config):
        evaluation["HyperParameters"] = sent
    document: dict[str, Any] = {
        "AgentConfig": {"CustomAgentLambdaConfig": {"LambdaArn": targets.agent_lambda_arn}},
        "InputDataConfig": [_channel("evaluation", targets.evaluation_uri)],
        "OutputDataConfig": output,
        "EvaluationConfig": evaluation,
    }
    if targets.model_package_arn:
        document["ModelPackageConfig"] = {"InputModelPackageArn": targets.model_package_arn}
    document["StoppingCondition"] = {"MaxRuntimeInSeconds": targets.max_runtime_seconds}
    return document


def create_evaluation_request(
    config: TrainingConfig,
    targets: EvaluationTargets,
    *,
    name: str,
    role_arn: str,
    tags: dict[str, str] | None = None,
) -> dict[str, Any]:
    """CreateJob's parameters for one of the run's evaluations (the arguments of the SDK's
    pipeline Job step, and the run's own tags)."""
    return {
        "JobName": name,
        "RoleArn": role_arn,
        "JobCategory": EVALUATION_CATEGORY,
        "JobConfigSchemaVersion": JOB_CONFIG_SCHEMA_VERSION,
        "JobConfigDocument": json.dumps(evaluation_document(config, targets)),
        "Tags": [{"Key": k, "Value": v} for k, v in (tags or {}).items()],
    }


def agent_function_name(prefix: str) -> str:
    """The deployment's agent Lambda: the job sends it each rollout request."""
    return f"{prefix}-agent-rft"


def job_role_name(prefix: str) -> str:
    """The role SageMaker's managed job runs as (CreateJob's RoleArn)."""
    return f"{prefix}-agent-rft-job"
