"""The Nova job held against AWS's own code: the Forge SDK's recipe paths, BYOO overrides,
override rule and HyperPod CLI invocation (read from the installed amzn-nova-forge 1.4.10's
source, not imported: it needs Python 3.12 and the SageMaker SDK), and the launcher's images
(aws/sagemaker-hyperpod-recipes at commit 2631995, launcher/nova/constants/
rft_container_constants.py: not on PyPI, so its values are copied into the test with their
source)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from domain.nova_job import (
    BYOO_KEYS,
    EVALUATION_IMAGE_ACCOUNTS,
    EVALUATION_TASK,
    FORGE_EVALUATION_RECIPE,
    FORGE_RECIPE_SOURCE,
    FORGE_RECIPES,
    REPLICAS,
    RUN_NAME_LIMIT,
    SINGLE_TURN_REWARD,
    NovaRefused,
    apply_overrides,
    delegating,
    evaluation_image,
    evaluation_overrides,
    image_repositories,
    images,
    init_container_image,
    job_pattern,
    launcher_command,
    nova_problems,
    recipe_overrides,
    run_name,
    without_single_turn_reward,
)
from tests.forge_recipe import documented_byoo_recipe, forge_recipe
from tests.forge_sdk import sdk_function, sdk_source
from training_configs.schema import (
    SHIPPED,
    NovaRecipeSettings,
    TrainingConfig,
    TrainingConfigError,
    load_training_config,
    parse_training_config,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "wordle" / "config.yaml"
BYOO = {key: f"<{key}>" for key in BYOO_KEYS}


def test_the_byoo_overrides_are_the_sdks() -> None:
    """RFTMultiturnInfrastructure.get_recipe_overrides returns exactly these keys."""
    function = sdk_function("rft_multiturn/rft_multiturn.py", "get_recipe_overrides")
    (returned,) = [node.value for node in ast.walk(function) if isinstance(node, ast.Return)]
    assert isinstance(returned, ast.Dict)
    assert [ast.literal_eval(key) for key in returned.keys] == list(BYOO_KEYS)


def test_the_recipes_and_where_they_come_from_are_the_sdks() -> None:
    """get_recipe_path's map (TrainingMethod.* -> recipe file) and its download location."""
    function = sdk_function("rft_multiturn/rft_multiturn.py", "get_recipe_path")
    (recipe_map,) = [
        node.value
        for node in ast.walk(function)
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "recipe_map"
    ]
    by_method = {
        key.attr: ast.literal_eval(value)
        for key, value in zip(recipe_map.keys, recipe_map.values, strict=True)
    }
    assert {f"{path}.yaml" for path in FORGE_RECIPES.values()} == {
        by_method["RFT_MULTITURN_LORA"],
        by_method["RFT_MULTITURN_FULL"],
    }
    assert by_method["RFT_MULTITURN_LORA"] == FORGE_RECIPES["RFT_MULTITURN_LORA"] + ".yaml"
    assert by_method["RFT_MULTITURN_EVAL"] == f"{FORGE_EVALUATION_RECIPE}.yaml"
    (download,) = [
        node
        for node in ast.walk(function)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "download_file"
    ]
    bucket, key = (node for node in download.args[:2])
    prefix = "".join(
        part.value for part in key.values if isinstance(part, ast.Constant)
    )  # the f-string's text around {s3_key}
    assert f"s3://{ast.literal_eval(bucket)}/{prefix}{{recipe}}.yaml" == FORGE_RECIPE_SOURCE


def test_replicas_are_the_sdks_for_multi_turn_recipes() -> None:
    function = sdk_function("util/recipe.py", "_build_rft_overrides_from_recipe")
    enums = [
        ast.literal_eval(node.value)
        for node in ast.walk(function)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List)
    ]
    assert list(REPLICAS) == enums[0]  # the multi-turn branch comes first


def test_the_launcher_invocation_is_the_sdks() -> None:
    """SMHPRuntimeManager.execute: hyperpod start-job, its flags in order, and the two
    override parameters it sends."""
    function = sdk_function("manager/runtime_manager.py", "execute", "SMHPRuntimeManager")
    commands = [
        node
        for node in ast.walk(function)
        if isinstance(node, ast.List)
        and node.elts
        and isinstance(node.elts[0], ast.Constant)
        and node.elts[0].value == "hyperpod"
    ]
    (command,) = commands
    flags = [e.value for e in command.elts if isinstance(e, ast.Constant)]
    (overrides,) = [node for node in ast.walk(function) if isinstance(node, ast.Dict)]
    ours = launcher_command(recipe="r", instance_type="ml.p5.48xlarge", container="img")
    assert [part for part in ours if part.startswith(("hyperpod", "start-job", "--"))] == flags
    assert ours[ours.index("--namespace") + 1] == "kubeflow"
    assert set(json.loads(ours[-1])) == {ast.literal_eval(k) for k in overrides.keys}


# aws/sagemaker-hyperpod-recipes@0700d22 (the launcher's pin, LAUNCHER_RECIPES),
# launcher/nova/constants/rft_container_constants.py RFT_REGION_ACCOUNT_MAP: its launcher raises
# "Nova RFT recipes are not supported for region" elsewhere (launcher/nova/utils.py).
LAUNCHER_ACCOUNTS = {"us-east-1": "708977205387"}
LAUNCHER_TAGS = {
    "SM-HP-RFT-TRAIN-V2-latest", "SM-HP-RFT-GENERATION-V2-latest", "SM-HP-RFT-STORM-V2-latest",
    "SM-HP-RFT-NATS-server-V2-latest", "SM-HP-RFT-NATS-reloader-V2-latest",
    "SM-HP-RFT-REDIS-V2-latest",
}  # fmt: skip


@pytest.mark.parametrize("region", sorted(LAUNCHER_ACCOUNTS))
def test_images_per_region_are_the_launchers(region: str) -> None:
    found = images(region)
    registry = f"{LAUNCHER_ACCOUNTS[region]}.dkr.ecr.{region}.amazonaws.com/nova-fine-tune-repo:"
    assert all(image.startswith(registry) for image in found.values())
    assert {image.removeprefix(registry) for image in found.values()} == LAUNCHER_TAGS
    assert found["training"].endswith(":SM-HP-RFT-TRAIN-V2-latest")


# The same commit's launcher/nova/constants/init_container_constants.py.
LAUNCHER_INIT_CONTAINER = "{account_id}.dkr.ecr.{region}.amazonaws.com/init-container-repo:latest"


def test_the_init_container_is_the_launchers() -> None:
    assert init_container_image("us-east-1") == LAUNCHER_INIT_CONTAINER.format(
        account_id=LAUNCHER_ACCOUNTS["us-east-1"], region="us-east-1"
    )
    assert init_container_image("eu-west-2") is None


def test_a_nova_jobs_pods_take_images_from_awss_repositories_only() -> None:
    """What the launcher group's admission fence admits: the repositories of every image above,
    and no tag (a fence on a tag would refuse the same image by digest)."""
    expected = {
        *(image.rpartition(":")[0] for image in images("us-east-1").values()),
        *(evaluation_image(region).rpartition(":")[0] for region in EVALUATION_IMAGE_ACCOUNTS),
        LAUNCHER_INIT_CONTAINER.format(account_id="708977205387", region="us-east-1").rpartition(
            ":"
        )[0],
    }
    assert set(image_repositories()) == expected
    assert all(repository.count("/") == 1 for repository in image_repositories())


def test_a_region_without_nova_images_is_refused_with_the_ones_that_have_them() -> None:
    with pytest.raises(NovaRefused, match=r"^region eu-west-2 has no Nova RFT images in AWS's "
                       r"launcher as deployed \(recipes 0700d22\); use one of us-east-1$"):  # fmt: skip
        images("eu-west-2")


def _config(**changes: Any) -> TrainingConfig:
    return load_training_config(EXAMPLE).model_copy(update=changes)


def test_every_config_key_for_the_job_lands_on_its_recipe_leaf() -> None:
    config = load_training_config(EXAMPLE)
    overrides = recipe_overrides(
        config, name="n", data_s3_path="s3://b/d.jsonl", output_s3_path="s3://b/runs/r/", byoo=BYOO
    )
    assert overrides == {
        "name": "n", "model_name_or_path": "nova-lite-2/prod", "data_s3_path": "s3://b/d.jsonl",
        "output_s3_path": "s3://b/runs/r/", "replicas": 4, "rollout_worker_replicas": 1,
        "generation_replicas": config.generation_replicas, "max_steps": config.max_steps,
        "global_batch_size": config.global_batch_size, "max_seq_length": config.max_length,
        "max_new_tokens": config.max_new_tokens, "number_generation": config.group_size,
        "timeout": config.rollout_timeout_seconds, "lr": config.learning_rate,
        "clip_ratio_high": config.clip_ratio, "delegate": True, "alpha": config.lora.alpha,
        **BYOO,
    }  # fmt: skip


# Where each knob of the config's `nova` section sits in the user guide's BYOO recipe.
KNOB_PATHS = {
    "reasoning_effort": ("training_config", "reasoning_effort"),
    "age_tolerance": ("training_config", "rollout", "rollout_strategy", "age_tolerance"),
    "temperature": ("training_config", "rollout", "generator", "temperature"),
    "top_k": ("training_config", "rollout", "generator", "top_k"),
    "max_model_len": ("training_config", "rollout", "generator", "max_model_len"),
    "save_steps": ("training_config", "train", "save_steps"),
    "save_top_k": ("training_config", "train", "save_top_k"),
    "ent_coeff": ("training_config", "train", "ent_coeff"),
    "weight_decay": ("training_config", "train", "optim", "weight_decay"),
    "warmup_steps": ("training_config", "train", "optim", "warmup_steps"),
    "min_lr": ("training_config", "train", "optim", "min_lr"),
    "rollout_worker_replicas": ("run", "rollout_worker_replicas"),
}


def _at(recipe: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        recipe = recipe[key]
    return recipe


def test_each_nova_knob_sets_its_leaf_of_the_documented_recipe_and_unset_ones_leave_it() -> None:
    knobs = {
        "reasoning_effort": "low", "age_tolerance": 1, "temperature": 0.7, "top_k": 50,
        "max_model_len": 8192, "save_steps": 5, "save_top_k": 2, "ent_coeff": 0.002,
        "weight_decay": 0.1, "warmup_steps": 3, "min_lr": 1e-8, "rollout_worker_replicas": 2,
    }  # fmt: skip
    assert set(knobs) == set(KNOB_PATHS) == set(NovaRecipeSettings.model_fields)
    config = _config(nova=NovaRecipeSettings(**knobs))
    overrides = recipe_overrides(config, name="n", data_s3_path="d", output_s3_path="o", byoo=BYOO)
    built = apply_overrides(documented_byoo_recipe(), overrides)
    assert {knob: _at(built.recipe, path) for knob, path in KNOB_PATHS.items()} == knobs
    unset = recipe_overrides(_config(), name="n", data_s3_path="d", output_s3_path="o", byoo=BYOO)
    kept = apply_overrides(documented_byoo_recipe(), unset).recipe
    assert {knob: _at(kept, path) for knob, path in KNOB_PATHS.items()} == {
        knob: _at(documented_byoo_recipe(), path) for knob, path in KNOB_PATHS.items()
    }


@pytest.mark.parametrize(
    ("knobs", "said"),
    [
        ({"save_steps": 11}, "config: nova.save_steps (11) is more than max_steps (10); lower it"),
        (
            {"warmup_steps": 11},
            "config: nova.warmup_steps (11) is more than max_steps (10); lower it",
        ),
        (
            {"max_model_len": 256},
            "config: nova.max_model_len (256) must be larger than max_new_tokens "
            "(256): a reply has to fit the generator's context",
        ),
        ({"reasoning_effort": "medium"}, "nova.reasoning_effort: Input should be 'low' or 'high'"),
        ({"weight_decay": 1.5}, "nova.weight_decay: Input should be less than or equal to 1"),
        (
            {"rollout_worker_replicas": 0},
            "nova.rollout_worker_replicas: Input should be greater than or equal to 1",
        ),
        ({"lr": 1e-5}, "nova.lr: unknown key (check its spelling)"),
    ],
)
def test_a_knob_out_of_range_is_refused_naming_the_key(knobs: dict[str, Any], said: str) -> None:
    raw = yaml.safe_load(EXAMPLE.read_text()) | {"nova": knobs}
    with pytest.raises(TrainingConfigError) as refused:
        parse_training_config(yaml.safe_dump(raw), "cfg.yaml")
    assert str(refused.value) == f"config cfg.yaml: {said}"


@pytest.mark.parametrize("name", [*SHIPPED, str(EXAMPLE)])
def test_the_shipped_configs_and_the_example_run_as_nova_jobs(name: str) -> None:
    assert nova_problems(load_training_config(name)) == []


def test_a_config_written_out_whole_is_still_one_a_nova_job_takes() -> None:
    """Local mode and the CLI write configs with every field; the defaults are not choices."""
    config = load_training_config(EXAMPLE)
    assert nova_problems(TrainingConfig.model_validate(config.model_dump(mode="json"))) == []


def test_what_a_nova_job_cannot_take_is_refused_all_at_once_with_fixes() -> None:
    raw = EXAMPLE.read_text().replace("  alpha: 32", "  rank: 8\n  alpha: 48")
    raw = raw.replace("instance_count: 8", "instance_count: 5")
    raw = raw.replace("instance_type: ml.p5.48xlarge", "instance_type: ml.p4d.24xlarge")
    raw = raw.replace("kl_coefficient: 0.0", "kl_coefficient: 0.01")
    raw = raw.replace("model: nova-lite-2", "model: nova-pro")
    config = TrainingConfig.model_validate(yaml.safe_load(raw))
    with pytest.raises(NovaRefused) as refused:
        recipe_overrides(config, name="n", data_s3_path="d", output_s3_path="o", byoo=BYOO)
    assert str(refused.value).splitlines() == [
        "config 'wordle-example' cannot run as a Nova job:",
        "  - model 'nova-pro': Nova multi-turn RFT trains nova-lite-2 only",
        "  - instance_type ml.p4d.24xlarge: Nova's BYOO recipes run on ml.p5.48xlarge",
        "  - instance_count 5 leaves 1 training replicas beside the 2 generation replicas (a "
        "node each) and the 2 nodes AWS's chart needs for its CPU services (hub, prompter, RBS, "
        "NATS, Redis); Nova's recipe takes 2, 4, 6, 8 training replicas: set instance_count to "
        "one of 6, 8, 10, 12 (at least 6)",
        "  - kl_coefficient: Nova's recipe has no KL term to set; set 0 (it bounds updates with "
        "clip_ratio and an entropy bonus)",
        "  - lora.rank: Nova's LoRA recipe does not take it (it sets alpha); remove it or leave "
        "it at 32 for a Nova run",
        "  - lora.alpha 48: Nova's LoRA recipe takes one of 32, 64, 96, 128, 160, 192",
    ]


def test_overrides_set_every_leaf_of_their_name_and_skip_the_names_no_leaf_has() -> None:
    """RecipeBuilder._build_final_recipe: a leaf of the override's name is replaced wherever it
    is (interpolations included); an optimizer named distributed_fused_adam keeps its name; a
    name the recipe lacks is skipped and reported, never added (tests/domain/
    test_recipe_overrides.py runs the SDK's own function against this)."""
    recipe = {
        "run": {"name": "my-run", "replicas": 2, "rollout_request_arn": ""},
        "training_config": {
            "max_steps": 100,
            "rollout": {"timeout": 600, "generator": {"timeout": 1000}},
            "train": {"max_steps": "${training_config.max_steps}", "optim": {"lr": 1e-7}},
            "optimizer": {"name": "distributed_fused_adam"},
        },
    }
    built = apply_overrides(
        recipe,
        {"name": "run-7", "max_steps": 5, "delegate": True, "timeout": 300, "lr": 1e-5,
         "replicas": 4, "alpha": 64},
    )  # fmt: skip
    assert built.recipe["run"] == {"name": "run-7", "replicas": 4, "rollout_request_arn": ""}
    assert built.recipe["training_config"]["train"] == {"max_steps": 5, "optim": {"lr": 1e-5}}
    assert built.recipe["training_config"]["rollout"] == {
        "timeout": 300,
        "generator": {"timeout": 300},
    }
    assert built.recipe["training_config"]["optimizer"] == {"name": "distributed_fused_adam"}
    assert built.skipped == ("delegate", "alpha")  # in the order given
    assert built.missing(("alpha", "lr", "delegate")) == ["alpha", "delegate"]
    assert recipe["run"]["name"] == "my-run"  # the recipe given is left as it was


def test_a_recipe_that_does_not_delegate_its_rollouts_is_refused_naming_what_it_lacks() -> None:
    overrides = recipe_overrides(
        _config(), name="n", data_s3_path="d", output_s3_path="o", byoo=BYOO
    )
    byoo = documented_byoo_recipe()
    assert delegating(apply_overrides(byoo, overrides), "byoo.yaml").skipped == (
        "alpha", "rollout_request_queue_url"
    )  # fmt: skip
    del byoo["training_config"]["rollout"]["delegate"], byoo["run"]["generate_request_sqs_url"]
    with pytest.raises(NovaRefused) as refused:
        delegating(apply_overrides(byoo, overrides), "single.yaml")
    assert str(refused.value) == (
        "recipe single.yaml has no delegate, generate_request_sqs_url: it is not a BYOO recipe, "
        "and its job would not play rollouts through this run's reward workers; use the Forge "
        "BYOO recipe (the Nova user guide, 'BYOO recipe configuration')"
    )


@pytest.mark.parametrize("name", SHIPPED)
def test_the_documented_byoo_recipe_takes_every_override_but_the_sdks_queue_and_loras_alpha(
    name: str,
) -> None:
    """The user guide's BYOO recipe: every key a shipped config sets is one of its leaves, but
    the SDK's `rollout_request_queue_url` (which it lacks) and LoRA's `alpha` (it is a full
    fine-tuning recipe; the LoRA stand-in adds AWS's public LoRA section, which takes it)."""
    config = load_training_config(name)
    overrides = recipe_overrides(
        config, name="n", data_s3_path="s3://b/d.jsonl", output_s3_path="s3://b/r/", byoo=BYOO
    )
    lora = config.lora is not None
    documented = apply_overrides(documented_byoo_recipe(), overrides)
    assert documented.skipped == (*(("alpha",) if lora else ()), "rollout_request_queue_url")
    assert apply_overrides(forge_recipe(config.recipe), overrides).skipped == (
        "rollout_request_queue_url",
    )
    assert documented.recipe["training_config"]["max_seq_length"] == config.max_length


@pytest.mark.parametrize(
    "run_id", ["wordle-0a1b2c3d4e", "nova-held-50d5b38c7b", "a" * 53 + "-0123456789"]
)
def test_a_runs_jobs_have_names_apart_within_the_launchers_cut(run_id: str) -> None:
    """Training and each evaluation: whole within 34 characters, evaluations marked at the end,
    and no job the launcher makes of one name matches another's pattern."""
    names = [run_name("nova-mtrl", run_id, stage) for stage in (None, "baseline", "final")]
    assert all(len(name) <= RUN_NAME_LIMIT and name[0].isalpha() for name in names)
    assert names[1].endswith("-eval-b") and names[2].endswith("-eval-f")
    for name in names:
        job = f"{name}-x1y2z"
        assert [re.match(job_pattern(other), job) is not None for other in names] == [
            other == name for other in names
        ]


def test_the_evaluation_image_is_the_sdks_for_nova_2_on_hyperpod() -> None:
    """get_hub_recipe_metadata for RFT_EVAL (what RFT_MULTITURN_EVAL's metadata is read as) on
    SMHP: `<escrow account>.dkr.ecr.<region>.amazonaws.com/nova-evaluation-repo:` + `SM-HP-` +
    `Eval-V2-latest` for Nova 2, the accounts of REGION_TO_ESCROW_ACCOUNT_MAPPING."""
    metadata = ast.unparse(sdk_function("util/recipe.py", "get_hub_recipe_metadata"))
    for part in ("nova-evaluation-repo:", "'SM-HP-' if platform == Platform.SMHP",
                 "'Eval-V2-latest' if model.version == Version.TWO"):  # fmt: skip
        assert part in metadata, part
    (mapping,) = [
        node.value
        for node in ast.walk(ast.parse(sdk_source("core/constants.py")))
        if isinstance(node, ast.Assign)
        and getattr(node.targets[0], "id", "") == "REGION_TO_ESCROW_ACCOUNT_MAPPING"
    ]
    assert ast.literal_eval(mapping) == EVALUATION_IMAGE_ACCOUNTS
    assert evaluation_image("us-west-2") == (
        "176779409107.dkr.ecr.us-west-2.amazonaws.com/nova-evaluation-repo:SM-HP-Eval-V2-latest"
    )


def test_the_evaluation_leaves_are_those_the_sdk_sets_for_rft_multiturn_eval() -> None:
    """The task's recipe value, strategy and metric (core/enums.py, core/constants.py); the
    recipe builder's own leaves for an evaluation (name, model, data, output) and its removal of
    the single-turn reward Lambda (recipe/recipe_builder.py)."""
    enums, constants = sdk_source("core/enums.py"), sdk_source("core/constants.py")
    assert re.search(r'if self == EvaluationTask.RFT_MULTITURN_EVAL:\s+return "rft_eval"', enums)
    assert re.search(r'RFT_MULTITURN_EVAL = "rft_eval"  # Strategy', enums)
    assert "EvaluationTask.RFT_MULTITURN_EVAL: EvaluationStrategy.RFT_MULTITURN_EVAL" in constants
    assert "EvaluationTask.RFT_MULTITURN_EVAL: EvaluationMetric.ALL" in constants
    assert re.search(r'ALL = "all"', enums)
    assert EVALUATION_TASK == {"task": "rft_eval", "strategy": "rft_eval", "metric": "all"}
    builder = ast.unparse(sdk_function("recipe/recipe_builder.py", "build_and_validate"))
    section, key = SINGLE_TURN_REWARD
    assert f"del final_recipe_dict['{section}']['{key}']" in builder
    overrides = evaluation_overrides(
        name="n", model_name_or_path="m", data_s3_path="d", output_s3_path="o", byoo=BYOO
    )
    assert set(overrides) == {"name", "model_name_or_path", "data_s3_path", "output_s3_path",
                              *EVALUATION_TASK, *BYOO_KEYS}  # fmt: skip
    recipe = {"rl_env": {"reward_lambda_arn": "x", "rollout_request_arn": ""}, "run": {"n": 1}}
    assert without_single_turn_reward(recipe) == {
        "rl_env": {"rollout_request_arn": ""},
        "run": {"n": 1},
    }
    assert recipe["rl_env"]["reward_lambda_arn"] == "x"  # a copy: the recipe read is kept
