"""`mtrl plan` for a serverless config: the CreateJob request a run would send SageMaker's managed
multi-turn RL service, and its job document, read before paying; and the evaluation jobs' (the
base model before training, the trained model's package after) when the config holds records
out.

Offline: from the config, the deployment configuration (cdk.json) and domain/serverless_job.py;
no AWS call. What only a run or a deployed stack knows is shown as placeholders.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass
from typing import Any

from rich.table import Table

from domain.bucket import RUNS_PREFIX
from domain.episodes import EvaluationStage
from domain.evaluation import EVALUATION_RECORDS_OBJECT, TRAINING_RECORDS_OBJECT, results_prefix
from domain.naming import checkpoint_group_name, model_group_name, run_prefix
from domain.serverless_job import (
    HUB_NAME,
    SOURCES,
    EvaluationTargets,
    JobTargets,
    agent_function_name,
    create_evaluation_request,
    create_job_request,
    hub_model,
    hyperparameters,
    job_role_name,
    sent_hyperparameters,
    template_for,
    template_parameters,
)
from mtrl.console import out
from stacks.config import PlatformConfig
from training_configs.costs import estimate
from training_configs.schema import TrainingConfig

RUN = "<run id>"
# What no offline check can settle; docs/operators/nova-on-aws.md (the serverless plane) says the same.
UNVERIFIED = (
    "the hub's hyperparameters for the model (the SDK reads them from the hub at run time) "
    "equal AWS's published MTRL template parameters, which this plan checks against",
    "the managed job's per-token price (AWS says it bills per token; no price was found): the "
    "cost above is the reward workers and the platform only",
    "the deployment's model group takes the job's models (the SDK makes Nova's groups with "
    "restricted managed storage)",
    "the evaluation job's hyperparameters: the names the SDK's evaluator sends them by "
    "(sampling_temperature, top_p, max_tokens) are not those of AWS's published evaluation "
    "recipe (temperature, sampling_top_p, sampling_max_tokens), so it sends neither, as this "
    "plan does; the service then samples at the recipe's temperature 0",
    "the service plays an evaluation job's rollouts through the agent and the job runtime as "
    "it plays training's (the SDK's evaluator names the agent; the runtime calls are "
    "training's)",
)


@dataclass(frozen=True)
class ServerlessPlan:
    config: str
    model: str
    hub_model: str
    template: str
    # Each hyperparameter the config sets: its value, where it comes from, whether it is sent
    # (only values other than the template's default are, as the SDK sends them).
    hyperparameters: dict[str, dict[str, Any]]
    create_job: dict[str, Any]
    document: dict[str, Any]
    cost_per_hour_usd: float
    # Each held-out evaluation's CreateJob request, by stage (none: nothing held out).
    evaluations: dict[str, dict[str, Any]]
    unverified: tuple[str, ...] = UNVERIFIED

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def serverless_plan(
    config: TrainingConfig, platform: PlatformConfig, *, region: str
) -> ServerlessPlan:
    """The plan of a serverless run of `config` on `platform`; ServerlessRefused says what stops
    it (every reason at once)."""
    account = platform.account or "<account>"
    prefix = platform.name_prefix
    bucket = f"{prefix}-data-{account}-{region}"
    outputs = f"s3://{bucket}/{RUNS_PREFIX}{RUN}/"
    model = hub_model(config.model)
    group_arn = f"arn:aws:sagemaker:{region}:{account}:model-package-group/"
    agent = f"arn:aws:lambda:{region}:{account}:function:{agent_function_name(prefix)}"
    base_model = f"<DescribeHubContent {HUB_NAME} Model {model}: HubContentArn>"
    data_key = "<the deployment's data key ARN>"
    targets = JobTargets(
        agent_lambda_arn=agent,
        base_model_arn=base_model,
        train_uri=f"{outputs}{TRAINING_RECORDS_OBJECT}",
        output_uri=outputs,
        kms_key_arn=data_key,
        output_model_package_group_arn=group_arn + model_group_name(prefix),
        checkpoint_model_package_group_arn=group_arn + checkpoint_group_name(prefix),
    )
    name, role = (
        f"{run_prefix(prefix)}{RUN}",
        f"arn:aws:iam::{account}:role/{job_role_name(prefix)}",
    )
    request = create_job_request(config, targets, name=name, role_arn=role)
    evaluations = {
        stage: create_evaluation_request(
            config,
            EvaluationTargets(
                agent_lambda_arn=agent,
                base_model_arn=base_model,
                evaluation_uri=f"{outputs}{EVALUATION_RECORDS_OBJECT}",
                output_uri=results_prefix(outputs, stage),
                kms_key_arn=data_key,
                model_package_arn=(
                    "<DescribeJob " + name + ": ServiceOutput.OutputModelPackageArn>"
                    if stage is EvaluationStage.FINAL
                    else None
                ),
            ),
            name=f"{name}-{stage}",
            role_arn=role,
        )
        for stage in EvaluationStage
        if config.evaluates
    }
    sent = sent_hyperparameters(config)
    specs = template_parameters(template_for(config.model))
    return ServerlessPlan(
        config=config.name,
        model=config.model,
        hub_model=model,
        template=template_for(config.model),
        hyperparameters={
            name: {
                "value": str(value),
                "from": SOURCES.get(name, f"serverless.{name}"),
                "default": str(specs[name].get("default")),
                "sent": name in sent,
            }
            for name, value in hyperparameters(config).items()
        },
        create_job=request,
        document=json.loads(request["JobConfigDocument"]),
        cost_per_hour_usd=round(estimate(config).per_hour, 2),
        evaluations=evaluations,
    )


def print_serverless_plan(made: ServerlessPlan) -> None:
    show = functools.partial(out.print, highlight=False, soft_wrap=True)
    show(
        f"SageMaker managed multi-turn RL job plan for config {made.config} ({made.model}: "
        f"{HUB_NAME} {made.hub_model}, template {made.template})"
    )
    show(f"  cost            ${made.cost_per_hour_usd:,.2f}/hour before the job's token charge")
    table = Table(title="hyperparameters", title_justify="left")
    for column in ("name", "value", "from the config", "template default", "sent"):
        table.add_column(column, overflow="fold")
    for name, row in made.hyperparameters.items():
        table.add_row(
            name, row["value"], row["from"], row["default"], "yes" if row["sent"] else "no"
        )
    out.print(table)
    request = {key: value for key, value in made.create_job.items() if key != "JobConfigDocument"}
    show("CreateJob request (JobConfigDocument below):")
    show(json.dumps(request, indent=2))
    show("JobConfigDocument:")
    show(made.create_job["JobConfigDocument"])
    for stage, evaluation in made.evaluations.items():
        show(f"the {stage} evaluation's CreateJob request (its JobConfigDocument as JSON):")
        document = json.loads(evaluation["JobConfigDocument"])
        show(json.dumps(evaluation | {"JobConfigDocument": document}, indent=2))
    show("unverified until a first run on AWS:")
    for item in made.unverified:
        show(f"  - {item}")
