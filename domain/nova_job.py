"""A Nova multi-turn RFT job as AWS's own tools submit it: the Forge BYOO recipe, the overrides
a training config makes to it, the HyperPod CLI invocation, and the per-service images.

Sources (each pinned by tests/domain/test_nova_job.py):
- recipes and overrides: the Nova Forge SDK (amzn-nova-forge 1.4.10),
  `rft_multiturn/rft_multiturn.py` (`get_recipe_path`, `get_recipe_overrides`) and
  `recipe/recipe_builder.py` (`_build_final_recipe`: an override names a *leaf key* and sets
  every leaf of that name, wherever it sits in the recipe; a name no leaf has is skipped, never
  added — run against the SDK's own function by tests/domain/test_recipe_overrides.py); the
  leaf names a config sets are those of the Nova 2 user guide's BYOO recipe (nova-hp-rft-forge,
  "BYOO recipe configuration"), plus the SDK's own `rollout_request_queue_url` and LoRA's
  `alpha` (AWS's public RFT LoRA recipe);
- the invocation: the SDK's `SMHPRuntimeManager.execute` (`hyperpod start-job --namespace
  kubeflow --recipe <recipe> --override-parameters {"instance_type", "container"}`);
- images and the regions that have them: the recipes the launcher function installs
  (`LAUNCHER_RECIPES`: aws/sagemaker-hyperpod-recipes at the HyperPod CLI's pin),
  launcher/nova/constants/rft_container_constants.py — its launcher refuses any other region.

The Forge recipes themselves are for Forge subscribers (the SDK downloads them from Forge's
bucket): offline, a plan shows the overrides; given the recipe file, the recipe after them.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from domain.nova_capacity import JobNodes, service_nodes
from domain.run_queues import QueueKind
from training_configs.schema import Recipe, TrainingConfig

NAMESPACE = "kubeflow"
FORGE_RECIPES: dict[Recipe, str] = {
    "RFT_MULTITURN_LORA": "fine-tuning/nova/forge/nova_2_0/nova_lite/RFT/nova_lite_2_0_p5_gpu_lora_rft_byoo",
    "RFT_MULTITURN_FULL": "fine-tuning/nova/forge/nova_2_0/nova_lite/RFT/nova_lite_2_0_p5_gpu_rft_byoo",
}
# AWS's multi-turn evaluation over the same BYOO endpoints (the SDK's RFT_MULTITURN_EVAL).
FORGE_EVALUATION_RECIPE = (
    "evaluation/nova/forge/nova_2_0/nova_lite/nova_lite_2_0_p5_gpu_rft_long_process_eval"
)
FORGE_RECIPE_SOURCE = (
    "s3://nova-forge-c7363-206080352451-us-east-1/v1/src/hyperpod_cli/"
    "sagemaker_hyperpod_recipes/recipes_collection/recipes/{recipe}.yaml"
)
# Every Forge recipe a deployment's runs read (training, evaluation).
FORGE_RECIPE_PATHS = (*FORGE_RECIPES.values(), FORGE_EVALUATION_RECIPE)
# Nova multi-turn RFT trains Nova 2 Lite only (the SDK's RFTMultiturnDatasetValidator).
NOVA_MODELS = {"nova-lite-2": "nova-lite-2/prod"}
NOVA_INSTANCE_TYPE = "ml.p5.48xlarge"  # the recipes' "p5" (FORGE_RECIPES)
# The training replicas the SDK allows for multi-turn recipes (`_build_rft_overrides_from_recipe`).
REPLICAS = (2, 4, 6, 8)
# LoRA alpha as AWS's public RFT LoRA recipe allows it.
LORA_ALPHAS = (32, 64, 96, 128, 160, 192)

# Leaves named `name` that are not the run's name (the SDK leaves these as they are).
KEPT_NAMES = ("distributed_fused_adam",)

# The recipes and launcher the launcher function's image installs: the submodule of the HyperPod
# CLI commit stacks/assets/launcher/Dockerfile pins (tests/launcher/test_image.py holds both).
LAUNCHER_RECIPES = "0700d22"
# Where that launcher publishes Nova's RFT images (and its init container): its
# RFT_REGION_ACCOUNT_MAP. AWS's release of 2026-06-22 (2631995) adds ap-northeast-1,
# eu-central-1 and eu-west-2; they come with a newer pin.
IMAGE_ACCOUNTS = {"us-east-1": "708977205387"}
# Said of a region outside IMAGE_ACCOUNTS (plans, the deployment's config, mtrl doctor).
NO_IMAGES = f"has no Nova RFT images in AWS's launcher as deployed (recipes {LAUNCHER_RECIPES})"
IMAGE_TAGS = {
    "training": "SM-HP-RFT-TRAIN-V2-latest",
    "generation": "SM-HP-RFT-GENERATION-V2-latest",
    "storm": "SM-HP-RFT-STORM-V2-latest",  # hub, prompter, RBS
    "nats_server": "SM-HP-RFT-NATS-server-V2-latest",
    "nats_reloader": "SM-HP-RFT-NATS-reloader-V2-latest",
    "redis": "SM-HP-RFT-REDIS-V2-latest",
}
# Nova 2's evaluation image on HyperPod, by region (the SDK's util/recipe.py
# `get_hub_recipe_metadata` for RFT_EVAL on SMHP: `<escrow account>.dkr.ecr.<region>.amazonaws.com/
# nova-evaluation-repo:SM-HP-Eval-V2-latest`; accounts: core/constants.py
# REGION_TO_ESCROW_ACCOUNT_MAPPING).
EVALUATION_IMAGE_ACCOUNTS = {
    "us-east-1": "708977205387",
    "us-west-2": "176779409107",
    "eu-west-2": "470633809225",
}
EVALUATION_IMAGE_TAG = "SM-HP-Eval-V2-latest"
# The init container AWS's launcher gives the chart's prompter (its INIT_CONTAINER_REGION_ACCOUNT_MAP
# and INIT_CONTAINER_IMAGE_URI, launcher/nova/constants/init_container_constants.py).
INIT_CONTAINER_ACCOUNTS = {"us-east-1": "708977205387"}
INIT_CONTAINER_IMAGE = "init-container-repo:latest"
# What the SDK sets on an RFT_MULTITURN_EVAL recipe (recipe/recipe_builder.py: the task's
# `get_recipe_value`, EVAL_TASK_STRATEGY_MAP and EVAL_TASK_METRIC_MAP of core/constants.py).
EVALUATION_TASK = {"task": "rft_eval", "strategy": "rft_eval", "metric": "all"}
# The SDK drops the single-turn reward Lambda from a multi-turn evaluation recipe
# (`build_and_validate`): rollouts come through the BYOO endpoints instead.
SINGLE_TURN_REWARD = ("rl_env", "reward_lambda_arn")
# The run's BYOO endpoints, by the recipe's leaf key (the SDK's `get_recipe_overrides`).
BYOO_KEYS = (
    "rollout_request_arn",
    "rollout_response_sqs_url",
    "rollout_request_queue_url",
    "generate_request_sqs_url",
    "generate_response_sqs_url",
)

# The name of the Lambda a Nova job on HyperPod invokes holds "SageMaker": the Forge SDK refuses
# any other for SMHP (validation/validator.py `validate_rft_lambda_name`), and its multi-turn
# stack names its functions `*-SageMaker-*` (rft_multiturn/base_infra.py, the policy's Lambda
# resources). The mark stays in the function's name whatever a run appends to its ARN.
ROLLOUT_FUNCTION_MARK = "SageMaker"


def rollout_function_name(prefix: str) -> str:
    """The name of a deployment's rollout Lambda (the BYOO `rollout_request_arn`'s function)."""
    return f"{prefix}-{ROLLOUT_FUNCTION_MARK}-rollout"


# The endpoints the user guide's BYOO recipe takes: without all four a job cannot play its
# rollouts through the run's reward workers (`rollout_request_queue_url` is the SDK's alone).
DOCUMENTED_BYOO_KEYS = tuple(key for key in BYOO_KEYS if key != "rollout_request_queue_url")
# What makes a training job delegate its rollouts (the BYOO recipe's `rollout.delegate: true`).
DELEGATE = "delegate"
# Subtrees the SDK never walks: an override of their name sets their `enabled` leaf (the SDK's
# "Edge case in Eval BYOD", recipe_builder.py `_build_final_recipe`).
SWITCHED_SECTIONS = ("preprocessing", "postprocessing")


# The run's queue each BYOO endpoint but the rollout Lambda (the run's alias) is.
BYOO_QUEUES = {
    "rollout_response_sqs_url": QueueKind.ROLLOUT_RESPONSES,
    "rollout_request_queue_url": QueueKind.ROLLOUT_REQUESTS,
    "generate_request_sqs_url": QueueKind.GENERATE_REQUESTS,
    "generate_response_sqs_url": QueueKind.GENERATE_RESPONSES,
}
# Where a Nova model trains, and what to do when a deployment lacks it (Register and the planes).
NO_NOVA_GROUP = (
    "trains on a restricted instance group, and this deployment has none; add one to "
    "hyperpod_instance_groups (restricted: true, with its fsx) and deploy again "
    "(docs/operators/nova-on-aws.md)"
)

# Where a run keeps what each of its Nova jobs was started with (the recipe after overrides,
# the overrides it did not take), under its outputs.
SUBMITTED_RECIPES = "nova-recipes/"

# AWS's launcher names the job `<recipe run.name, cut to 34 characters>-<5 random [a-z0-9]>`
# (aws/sagemaker-hyperpod-recipes main.py `valid_run_name`; 47 before the June 2026 release), so
# a run's name fits whole and its job is found again by that name and the suffix.
RUN_NAME_LIMIT = 34
JOB_SUFFIX = r"-[a-z0-9]{5}"


class NovaRefused(ValueError):
    """A config, model or region a Nova job cannot take; the text says each reason and fix."""


def is_nova(model: str) -> bool:
    return model.startswith("nova")


def images(region: str) -> dict[str, str]:
    """The job's images by service, in `region`'s Nova account."""
    account = IMAGE_ACCOUNTS.get(region)
    if account is None:
        raise NovaRefused(f"region {region} {NO_IMAGES}; use one of {', '.join(IMAGE_ACCOUNTS)}")
    registry = f"{account}.dkr.ecr.{region}.amazonaws.com/nova-fine-tune-repo"
    return {service: f"{registry}:{tag}" for service, tag in IMAGE_TAGS.items()}


def evaluation_image(region: str) -> str | None:
    """Nova 2's HyperPod evaluation image in `region` (None: AWS publishes none there)."""
    account = EVALUATION_IMAGE_ACCOUNTS.get(region)
    if account is None:
        return None
    return f"{account}.dkr.ecr.{region}.amazonaws.com/nova-evaluation-repo:{EVALUATION_IMAGE_TAG}"


def init_container_image(region: str) -> str | None:
    """The chart's init container in `region` (None: AWS's launcher publishes none there)."""
    account = INIT_CONTAINER_ACCOUNTS.get(region)
    if account is None:
        return None
    return f"{account}.dkr.ecr.{region}.amazonaws.com/{INIT_CONTAINER_IMAGE}"


def image_repositories() -> tuple[str, ...]:
    """Every ECR repository a Nova job's pods take their images from, in every region AWS
    publishes them in (`registry/repository`, no tag): only AWS pushes to them."""
    references = [
        *(image for region in IMAGE_ACCOUNTS for image in images(region).values()),
        *(evaluation_image(region) for region in EVALUATION_IMAGE_ACCOUNTS),
        *(init_container_image(region) for region in INIT_CONTAINER_ACCOUNTS),
    ]
    return tuple(sorted({ref.rpartition(":")[0] for ref in references if ref}))


def job_layout(config: TrainingConfig) -> JobNodes:
    """The nodes of the config's job, by what runs on them: a node per generation replica (a
    whole ml.p5.48xlarge each), those AWS's chart needs for its CPU services
    (domain/nova_capacity.py), and the rest for the recipe's training `replicas`."""
    services = service_nodes(rollout_workers=config.nova.rollout_worker_replicas)
    return JobNodes(
        training=config.instance_count - config.generation_replicas - services,
        generation=config.generation_replicas,
        services=services,
    )


def training_replicas(config: TrainingConfig) -> int:
    """The recipe's `replicas`."""
    return job_layout(config).training


def nova_problems(config: TrainingConfig) -> list[str]:
    """What in `config` a Nova job cannot take, each with its fix (empty: none)."""
    problems = []
    if config.model not in NOVA_MODELS:
        problems.append(
            f"model {config.model!r}: Nova multi-turn RFT trains {', '.join(NOVA_MODELS)} only"
        )
    if config.instance_type != NOVA_INSTANCE_TYPE:
        problems.append(
            f"instance_type {config.instance_type}: Nova's BYOO recipes run on {NOVA_INSTANCE_TYPE}"
        )
    layout = job_layout(config)
    if layout.training not in REPLICAS:
        fits = [layout.generation + layout.services + n for n in REPLICAS]
        problems.append(
            f"instance_count {config.instance_count} leaves {max(layout.training, 0)} "
            f"training replicas beside the {layout.generation} generation replicas (a "
            f"node each) and the {layout.services} nodes AWS's chart needs for its "
            f"CPU services (hub, prompter, RBS, NATS, Redis); Nova's recipe takes "
            f"{', '.join(map(str, REPLICAS))} training replicas: set instance_count to one of "
            f"{', '.join(map(str, fits))} (at least {fits[0]})"
        )
    if config.kl_coefficient:
        problems.append(
            "kl_coefficient: Nova's recipe has no KL term to set; set 0 (it bounds updates with "
            "clip_ratio and an entropy bonus)"
        )
    if config.lora is not None:
        # A value other than the default was chosen (a round trip through YAML sets them all).
        default = type(config.lora).model_fields["rank"].default
        if config.lora.rank != default:
            problems.append(
                f"lora.rank: Nova's LoRA recipe does not take it (it sets alpha); "
                f"remove it or leave it at {default} for a Nova run"
            )
        if config.lora.alpha not in LORA_ALPHAS:
            problems.append(
                f"lora.alpha {config.lora.alpha}: Nova's LoRA recipe takes one of "
                f"{', '.join(map(str, LORA_ALPHAS))}"
            )
    return problems


def recipe_overrides(
    config: TrainingConfig,
    *,
    name: str,
    data_s3_path: str,
    output_s3_path: str,
    byoo: dict[str, str],
    base_checkpoint: str | None = None,
) -> dict[str, Any]:
    """The recipe's leaf keys this config and run set (NovaRefused: `nova_problems`, all at
    once). `base_checkpoint`: an S3 checkpoint to train on from (iterative training: the Forge
    SDK sets `model_name_or_path` to it, recipe/recipe_builder.py)."""
    problems = nova_problems(config)
    if problems:
        raise NovaRefused(
            f"config {config.name!r} cannot run as a Nova job:\n  - " + "\n  - ".join(problems)
        )
    overrides: dict[str, Any] = {
        "name": name,
        "model_name_or_path": base_checkpoint or NOVA_MODELS[config.model],
        "data_s3_path": data_s3_path,
        "output_s3_path": output_s3_path,
        "replicas": training_replicas(config),
        "generation_replicas": config.generation_replicas,
        "max_steps": config.max_steps,
        "global_batch_size": config.global_batch_size,
        "max_seq_length": config.max_length,
        "max_new_tokens": config.max_new_tokens,
        "number_generation": config.group_size,
        "timeout": config.rollout_timeout_seconds,
        "lr": config.learning_rate,
        "clip_ratio_high": config.clip_ratio,
        DELEGATE: True,
        **config.nova.chosen(),
    }
    if config.lora is not None:
        overrides["alpha"] = config.lora.alpha
    return {**overrides, **{key: byoo[key] for key in BYOO_KEYS}}


def evaluation_overrides(
    *,
    name: str,
    model_name_or_path: str,
    data_s3_path: str,
    output_s3_path: str,
    byoo: dict[str, str],
) -> dict[str, Any]:
    """The leaves the Forge SDK sets on the RFT multi-turn evaluation recipe for a model
    (`RecipeBuilder` for EvaluationTask.RFT_MULTITURN_EVAL on SMHP): the job's name, the model
    or checkpoint, the records to evaluate, where results go, the task, and the BYOO endpoints
    (the recipe's replicas and inference settings stay AWS's)."""
    return {
        "name": name,
        "model_name_or_path": model_name_or_path,
        "data_s3_path": data_s3_path,
        "output_s3_path": output_s3_path,
        **EVALUATION_TASK,
        **{key: byoo[key] for key in BYOO_KEYS},
    }


def tracking_overrides(
    recipe: dict[str, Any], *, tracking_uri: str | None, experiment: str, run_name: str
) -> dict[str, Any]:
    """The recipe's MLflow settings for the deployment's tracking server, where the recipe has
    them (AWS's Nova 2 recipes, aws/sagemaker-hyperpod-recipes: `run.mlflow_tracking_uri`
    "Required for MLFlow", `mlflow_experiment_name` and `mlflow_run_name` "leave this field
    non-empty"); none without a server or keys."""
    keys = {"mlflow_tracking_uri", "mlflow_experiment_name", "mlflow_run_name"}
    if tracking_uri is None or not keys <= recipe_leaves(recipe):
        return {}
    return {
        "mlflow_tracking_uri": tracking_uri,
        "mlflow_experiment_name": experiment,
        "mlflow_run_name": run_name,
    }


def recipe_leaves(recipe: dict[str, Any]) -> set[str]:
    """Every leaf key of a recipe, wherever it sits."""
    leaves: set[str] = set()
    for key, value in recipe.items():
        leaves |= recipe_leaves(value) if isinstance(value, dict) else {key}
    return leaves


def without_single_turn_reward(recipe: dict[str, Any]) -> dict[str, Any]:
    """The recipe without its single-turn reward Lambda (`SINGLE_TURN_REWARD`), as the SDK
    sends a multi-turn evaluation."""
    section, key = SINGLE_TURN_REWARD
    kept = copy.deepcopy(recipe)
    if isinstance(kept.get(section), dict):
        kept[section].pop(key, None)
    return kept


@dataclass(frozen=True)
class BuiltRecipe:
    """A recipe after overrides, and the override keys it had no leaf for (skipped, as the SDK
    skips them: a warning for the reader, never a refusal)."""

    recipe: dict[str, Any]
    skipped: tuple[str, ...]

    def missing(self, keys: tuple[str, ...]) -> list[str]:
        """Which of `keys` the recipe did not take."""
        return [key for key in keys if key in self.skipped]


def apply_overrides(recipe: dict[str, Any], overrides: dict[str, Any]) -> BuiltRecipe:
    """The recipe with every leaf named in `overrides` set, exactly as the Forge SDK's
    `_build_final_recipe` sets them: every leaf of that name, wherever it is; an optimizer named
    distributed_fused_adam keeps its name; an integer temperature becomes a float; a
    preprocessing/postprocessing section is not walked, its override sets its `enabled`. The
    recipe given is left as it was."""
    built = copy.deepcopy(recipe)
    taken: set[str] = set()

    def walk(node: dict[str, Any]) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                if key not in SWITCHED_SECTIONS:
                    walk(value)
                elif key in overrides:
                    value["enabled"] = overrides[key]
                    taken.add(key)
            elif key in overrides and not (key == "name" and value in KEPT_NAMES):
                new = overrides[key]
                node[key] = float(new) if key == "temperature" and isinstance(new, int) else new
                taken.add(key)

    walk(built)
    return BuiltRecipe(built, tuple(key for key in overrides if key not in taken))


def delegating(built: BuiltRecipe, source: str) -> BuiltRecipe:
    """`built` if its job plays its rollouts through the run's endpoints; NovaRefused naming
    what the recipe at `source` lacks otherwise (it is not a BYOO recipe)."""
    lacking = built.missing((DELEGATE, *DOCUMENTED_BYOO_KEYS))
    if lacking:
        raise NovaRefused(
            f"recipe {source} has no {', '.join(lacking)}: it is not a BYOO recipe, and its job "
            "would not play rollouts through this run's reward workers; use the Forge BYOO "
            "recipe (the Nova user guide, 'BYOO recipe configuration')"
        )
    return built


def byoo_endpoints(
    rollout_request_arn: str, queue_url: Callable[[QueueKind], str]
) -> dict[str, str]:
    """A run's BYOO endpoints by recipe key: its rollout Lambda, and its queues' URLs."""
    return {
        key: queue_url(BYOO_QUEUES[key]) if key in BYOO_QUEUES else rollout_request_arn
        for key in BYOO_KEYS
    }


def run_name(prefix: str, run_id: str, stage: str | None = None) -> str:
    """The recipe's `run.name` for a run's training job, or for its `stage` evaluation (marked
    `-eval-` and the stage's initial, at the end): a DNS label starting with a letter, whole
    within the launcher's cut (a hash of the rest stands in when the run's id is longer), each
    job's apart from the others' (a run id ends in ten hex digits, never in a mark)."""
    mark = f"-eval-{stage[:1]}" if stage else ""
    name = re.sub(r"[^a-z0-9-]+", "-", f"{prefix}-{run_id}".lower()).strip("-")
    if not name[:1].isalpha():
        name = f"r-{name}"
    limit = RUN_NAME_LIMIT - len(mark)
    if len(name) > limit:
        digest = hashlib.sha256(name.encode()).hexdigest()[:10]
        name = f"{name[: limit - 11].rstrip('-')}-{digest}"
    return name + mark


def submitted_recipe_key(output_prefix: str, job_name: str) -> str:
    """Where the recipe job `job_name` of a run was started with is kept."""
    return f"{output_prefix}{SUBMITTED_RECIPES}{job_name}.json"


def recipe_skips(s3: Any, *, bucket: str, output_prefix: str) -> list[str]:
    """For each Nova job of a run whose recipe did not take every override, one line naming the
    keys it skipped (the records `submitted_recipe_key` keeps), in job order."""
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=f"{output_prefix}{SUBMITTED_RECIPES}"
    )
    keys = sorted(found["Key"] for page in pages for found in page.get("Contents", []))
    lines = []
    for key in keys:
        record = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        if record.get("skipped"):
            lines.append(
                f"the recipe of job {record['job']} has no {', '.join(record['skipped'])}: "
                "skipped, as the Forge SDK skips an override its recipe lacks"
            )
    return lines


def job_pattern(name: str) -> str:
    """A regular expression matching exactly the job names the launcher makes of run `name`."""
    return f"^{re.escape(name)}{JOB_SUFFIX}$"


def run_recipe(recipe: Recipe, name: str) -> str:
    """Where a run's recipe goes in the HyperPod CLI's recipes collection, as `--recipe` names
    it: beside the Forge recipe, named after the run (the SDK's layout,
    `RecipeBuilder._get_recipe_path`)."""
    return f"{FORGE_RECIPES[recipe].rpartition('/')[0]}/{name}"


def evaluation_run_recipe(name: str) -> str:
    """Where a run's evaluation recipe goes in the recipes collection: beside AWS's."""
    return f"{FORGE_EVALUATION_RECIPE.rpartition('/')[0]}/{name}"


def launcher_command(*, recipe: str, instance_type: str, container: str) -> list[str]:
    """The HyperPod CLI invocation that renders and starts the job (the recipe path is relative
    to the CLI's recipes collection, without `.yaml`)."""
    return [
        "hyperpod",
        "start-job",
        "--namespace",
        NAMESPACE,
        "--recipe",
        recipe,
        "--override-parameters",
        json.dumps({"instance_type": instance_type, "container": container}),
    ]
