"""`mtrl plan`: offline, what a run of a config would submit as a Nova job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from domain.nova_job import FORGE_RECIPES, NovaRefused, images
from domain.run_queues import QueueKind, queue_name
from mtrl.cli import app
from mtrl.ops.plan import plan as make_plan
from stacks.config import PlatformConfig, deployment_context
from tests.conftest import PINNED
from tests.forge_recipe import DOCUMENTED_BYOO_RECIPE, forge_recipe
from tests.training_configs.test_training_configs import LAUGHS
from training_configs.costs import estimate
from training_configs.schema import SHIPPED, load_training_config

runner = CliRunner()
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "wordle" / "config.yaml"


def plan(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["plan", *args])
    return result.exit_code, result.output


def test_the_json_plan_has_what_a_reader_checks_before_paying() -> None:
    code, output = plan("--config", str(EXAMPLE), "--region", "us-east-1", "--json")
    assert code == 0, output
    made = json.loads(output)
    assert {"instance_group", "recipe", "launcher", "images", "namespace", "byoo",
            "cost_per_hour_usd"} <= set(made)  # fmt: skip
    # The default deployment is Nova-ready: its restricted group, FSx as AWS's sample sizes it.
    assert made["instance_group"] == {
        "name": "nova", "instance_type": "ml.p5.48xlarge", "restricted": True,
        "fsx": {"size_gib": 9600, "per_unit_storage_throughput": 250},
    }  # fmt: skip
    assert made["warnings"] == []
    assert made["recipe"]["path"] == FORGE_RECIPES["RFT_MULTITURN_LORA"]
    assert made["recipe"]["rendered"] is None  # no Forge recipe file given
    command = made["launcher"]["command"]
    assert command[:4] == ["hyperpod", "start-job", "--namespace", "kubeflow"]
    # The run's recipe beside the Forge one, named after the run (the SDK's layout).
    recipe = command[command.index("--recipe") + 1]
    assert recipe == made["recipe"]["path"].rpartition("/")[0] + "/nova-mtrl-<run id>"
    assert json.loads(command[-1]) == {
        "instance_type": "ml.p5.48xlarge",
        "container": images("us-east-1")["training"],
    }
    assert made["images"] == images("us-east-1") and made["namespace"] == "kubeflow"
    assert set(made["byoo"]) == {
        "rollout_request_arn", "rollout_response_sqs_url", "generate_request_sqs_url",
        "generate_response_sqs_url",
    }  # fmt: skip
    # The deployment's rollout Lambda, unqualified, as the Forge SDK passes its stack's; the
    # run's queues as domain/run_queues names them.
    assert made["byoo"]["rollout_request_arn"] == (
        "arn:aws:lambda:us-east-1:<account>:function:nova-mtrl-SageMaker-rollout"
    )
    assert made["byoo"]["generate_request_sqs_url"] == (
        "https://sqs.us-east-1.amazonaws.com/<account>/nova-mtrl-run-<run id>-generate-requests.fifo"
    )
    assert queue_name("nova-mtrl", "r-1", QueueKind.GENERATE_REQUESTS) == (
        "nova-mtrl-run-r-1-generate-requests.fifo"
    )
    config = load_training_config(EXAMPLE)
    assert made["cost_per_hour_usd"] == round(estimate(config).per_hour, 2)
    assert made["nodes"] == {"training": 4, "generation": 2, "services": 2, "total": 8}
    overrides = made["recipe"]["overrides"]
    assert overrides["rollout_request_arn"] == made["byoo"]["rollout_request_arn"]
    assert (overrides["max_steps"], overrides["number_generation"]) == (10, 8)


@pytest.mark.parametrize("name", SHIPPED)
def test_on_the_documented_byoo_recipe_it_shows_the_recipe_the_endpoints_and_what_was_skipped(
    name: str,
) -> None:
    """The recipe exactly as the Nova user guide prints it, for each shipped config."""
    args = ("--config", name, "--region", "us-east-1", "--recipe", str(DOCUMENTED_BYOO_RECIPE))
    code, output = plan(*args, "--json")
    assert code == 0, output
    made = json.loads(output)
    config = load_training_config(name)
    rendered = made["recipe"]["rendered"]
    assert rendered["training_config"]["max_seq_length"] == config.max_length
    assert rendered["training_config"]["rollout"]["delegate"] is True
    assert rendered["training_config"]["rollout"]["advantage_strategy"] == {
        "number_generation": config.group_size
    }
    assert rendered["training_config"]["train"]["max_steps"] == config.max_steps
    assert {key: rendered["run"][key] for key in made["byoo"]} == made["byoo"]
    lora = config.lora is not None
    assert made["recipe"]["skipped"] == [*(["alpha"] if lora else []), "rollout_request_queue_url"]
    text = plan(*args)[1]
    for part in (
        "recipe after overrides:", "    delegate: true", "  generate_request_sqs_url: https://sqs.",
        f"warning: the recipe has no leaf for {', '.join(made['recipe']['skipped'])}: skipped, "
        "as the Forge SDK skips them",
    ):  # fmt: skip
        assert part in text, part


def test_a_recipe_that_takes_every_override_says_so(tmp_path: Path) -> None:
    recipe = tmp_path / "lora.yaml"
    taken = forge_recipe("RFT_MULTITURN_LORA")
    taken["run"]["rollout_request_queue_url"] = ""
    recipe.write_text(yaml.safe_dump(taken))
    code, output = plan("--config", str(EXAMPLE), "--region", "us-east-1", "--recipe", str(recipe))
    assert code == 0 and "the recipe took every override" in output, output


def test_a_recipe_that_does_not_delegate_its_rollouts_is_refused(tmp_path: Path) -> None:
    recipe = tmp_path / "single-turn.yaml"
    recipe.write_text(yaml.safe_dump({"run": {"name": "x", "replicas": 2}}))
    code, output = plan("--config", str(EXAMPLE), "--region", "us-east-1", "--recipe", str(recipe))
    assert (code, output.strip()) == (
        1,
        f"error: recipe {recipe} has no delegate, rollout_request_arn, rollout_response_sqs_url, "
        "generate_request_sqs_url, generate_response_sqs_url: it is not a BYOO recipe, and its "
        "job would not play rollouts through this run's reward workers; use the Forge BYOO "
        "recipe (the Nova user guide, 'BYOO recipe configuration')",
    )


def test_a_recipe_file_that_is_not_a_yaml_mapping_is_refused_in_one_line(tmp_path: Path) -> None:
    broken, listed = tmp_path / "broken.yaml", tmp_path / "listed.yaml"
    broken.write_text("run:\n  name: [x\n")
    listed.write_text("- a\n- b\n")
    laughs, deep = tmp_path / "laughs.yaml", tmp_path / "deep.yaml"
    laughs.write_text(LAUGHS.replace("environment_args", "run"))
    deep.write_text("run:\n  name: x\n  tags: " + "[" * 5000 + "]" * 5000 + "\n")
    for recipe, said in (
        (broken, f"error: recipe {broken}: not valid YAML at line 3"),
        (listed, f"error: recipe {listed}: expected a YAML mapping"),
        (
            laughs,
            f"error: recipe {laughs}: line 5: its YAML aliases (*name) expand to more "
            "than 100000 values: reuse fewer values",
        ),
        (
            deep,
            f"error: recipe {deep}: line 3: nested more than 100 levels deep: nest less deeply",
        ),
    ):
        code, output = plan("--config", str(EXAMPLE), "--region", "us-east-1", "--recipe",
                            str(recipe))  # fmt: skip
        assert (code, output.strip()) == (1, said)


def test_refusals_exit_1_and_bad_input_exits_2_without_a_traceback(tmp_path: Path) -> None:
    code, output = plan("--config", str(EXAMPLE), "--region", "eu-west-2")
    assert (code, output.strip()) == (
        1,
        "error: region eu-west-2 has no Nova RFT images in AWS's launcher as deployed (recipes "
        "0700d22); use one of us-east-1",
    )
    qwen = tmp_path / "qwen.yaml"
    qwen.write_text(EXAMPLE.read_text().replace("model: nova-lite-2", "model: qwen3-8b"))
    code, output = plan("--config", str(qwen), "--region", "us-east-1")
    assert code == 1 and "is not a Nova model: `mtrl plan` shows Nova jobs only" in output
    code, output = plan("--config", str(tmp_path / "none.yaml"), "--region", "us-east-1")
    assert code == 2 and "no such file" in output
    code, output = plan("--config", str(EXAMPLE))  # cdk.json names no region
    assert (code, output.strip()) == (2, "error: no region: pass --region (cdk.json sets none)")
    code, output = plan("--config", str(EXAMPLE), "--region", "us-east-1", "--recipe",
                        str(tmp_path / "missing.yaml"))  # fmt: skip
    assert code == 2 and "cannot read (No such file or directory)" in output
    assert "Traceback" not in output


def test_the_readable_plan_shows_each_part() -> None:
    code, output = plan("--config", "rft_multiturn_full", "--region", "us-east-1")
    assert code == 0, output
    for part in ("instance group  nova (ml.p5.48xlarge), restricted: yes, FSx for Lustre: 9600 "
                 "GiB at 250 MB/s/TiB",
                 "nodes           12: 6 training replicas, 4 generation replicas, 2 for the "
                 "chart's CPU services (hub, prompter, RBS, NATS, Redis)",
                 "launcher        hyperpod start-job --namespace kubeflow --recipe "
                 "'fine-tuning/nova/forge/nova_2_0/nova_lite/RFT/nova-mtrl-<run id>'",
                 "unverified until a first run on AWS:"):  # fmt: skip
        assert part in output, part


def test_an_open_weights_only_deployment_plans_on_its_gpu_group_and_says_register_refuses() -> None:
    platform = PlatformConfig.from_context(deployment_context({"nova_restricted_group": "false"}))
    made = make_plan(load_training_config(EXAMPLE), platform, region="us-east-1")
    assert made.instance_group["name"] == "gpu"
    assert made.warnings[0].startswith(
        "this deployment has no restricted instance group: Register refuses a Nova run until "
        "hyperpod_instance_groups has one"
    )


def test_a_job_below_the_documented_minimum_is_planned_with_a_warning(tmp_path: Path) -> None:
    """Two training replicas (the SDK's least) take 6 nodes with the chart's services: a layout
    AWS's recipe code allows and its compute table (8 for RFT on HyperPod) does not document."""
    small = tmp_path / "small.yaml"
    small.write_text(EXAMPLE.read_text().replace("instance_count: 8", "instance_count: 6"))
    code, output = plan("--config", str(small), "--region", "us-east-1", "--json")
    assert code == 0, output
    made = json.loads(output)
    assert made["nodes"] == {"training": 2, "generation": 2, "services": 2, "total": 6}
    assert made["warnings"][-1] == (
        "the job takes 6 nodes, fewer than the 8 the Nova user guide gives as the minimum for "
        "RFT on HyperPod: a layout AWS does not document"
    )
    small.write_text(EXAMPLE.read_text().replace("instance_count: 8", "instance_count: 4"))
    code, output = plan("--config", str(small), "--region", "us-east-1")
    assert code == 1 and "set instance_count to one of 6, 8, 10, 12 (at least 6)" in output


def test_a_config_for_another_instance_type_than_the_groups_is_refused() -> None:
    platform = PlatformConfig.from_context(deployment_context({}))
    p4d = platform.model_copy(
        update={
            "hyperpod_instance_groups": [
                group.model_copy(update={"instance_type": "ml.p4d.24xlarge"})
                for group in platform.hyperpod_instance_groups
            ]
        }
    )
    with pytest.raises(NovaRefused) as refused:
        make_plan(load_training_config(EXAMPLE), p4d, region="us-east-1")
    assert str(refused.value) == (
        "config 'wordle-example' asks for ml.p5.48xlarge; this deployment's training instance "
        "group 'nova' runs ml.p4d.24xlarge"
    )


def test_a_deployment_with_a_restricted_group_plans_the_job_there() -> None:
    platform = PlatformConfig.from_context(
        deployment_context({k: v for k, v in PINNED.items() if k.startswith(("hyperpod", "train"))})
    )
    made = make_plan(load_training_config(EXAMPLE), platform, region="us-east-1")
    assert made.instance_group == {
        "name": "nova",
        "instance_type": "ml.p5.48xlarge",
        "restricted": True,
        "fsx": {"size_gib": 2400, "per_unit_storage_throughput": 250},
    }
    assert made.warnings == ()


@pytest.mark.parametrize(
    ("base", "shown"),
    [
        (None, "nova-lite-2/prod"),
        ("s3://customer-escrow/job-abcde/ckpt", "s3://customer-escrow/job-abcde/ckpt"),
        ("run:wordle-0123456789", "<last checkpoint of run wordle-0123456789>"),
    ],
)
def test_iterative_training_sets_the_model_path_to_the_base_checkpoint(
    tmp_path: Path, base: str | None, shown: str
) -> None:
    """The Forge SDK trains on from a checkpoint by setting `model_name_or_path` to it."""
    config = tmp_path / "again.yaml"
    config.write_text(
        yaml.safe_dump(yaml.safe_load(EXAMPLE.read_text()) | {"base_checkpoint": base})
    )
    code, output = plan("--config", str(config), "--region", "us-east-1", "--json")
    assert code == 0, output
    assert json.loads(output)["recipe"]["overrides"]["model_name_or_path"] == shown


def test_the_job_is_planned_on_the_records_it_may_train_on() -> None:
    """A share held out for evaluation: the dataset without it, written for the run; none held
    out (or a named evaluation file): the uploaded dataset."""
    platform = PlatformConfig.from_context(deployment_context({}))
    config = load_training_config(EXAMPLE)
    held = make_plan(config, platform, region="us-east-1")
    assert held.recipe["overrides"]["data_s3_path"].endswith("/runs/<run id>/data/training.jsonl")
    whole = make_plan(
        config.model_copy(update={"eval_fraction": 0.0}), platform, region="us-east-1"
    )
    assert whole.recipe["overrides"]["data_s3_path"].endswith("/training-data/<dataset>.jsonl")


SERVERLESS = EXAMPLE.with_name("serverless.yaml")


def test_a_serverless_config_plans_the_create_job_request_and_its_document() -> None:
    code, output = plan("--config", str(SERVERLESS), "--region", "us-east-1", "--json")
    assert code == 0, output
    made = json.loads(output)
    request = made["create_job"]
    assert {key: request[key] for key in ("JobCategory", "JobConfigSchemaVersion")} == {
        "JobCategory": "AgentRFT",
        "JobConfigSchemaVersion": "1.0.0",
    }
    assert json.loads(request["JobConfigDocument"]) == made["document"]
    document = made["document"]
    # The job trains on the records not held out; AWS's evaluation jobs play the held-out ones,
    # the base model's before training, the trained package's after.
    assert [c["ChannelName"] for c in document["InputDataConfig"]] == ["train"]
    evaluations = made["evaluations"]
    assert list(evaluations) == ["baseline", "final"]
    for stage, evaluation in evaluations.items():
        assert (evaluation["JobCategory"], evaluation["RoleArn"]) == (
            "AgentRFTEvaluation", request["RoleArn"],
        )  # fmt: skip
        assert evaluation["JobName"] == f"{request['JobName']}-{stage}"
        evaluated = json.loads(evaluation["JobConfigDocument"])
        assert evaluated["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"].endswith(
            "/data/evaluation.jsonl"
        )
        assert ("ModelPackageConfig" in evaluated) == (stage == "final")
    assert document["AgentConfig"]["CustomAgentLambdaConfig"]["LambdaArn"].endswith(
        ":function:nova-mtrl-agent-rft"
    )
    assert document["TrainingConfig"]["HyperParameters"] == {
        name: row["value"] for name, row in made["hyperparameters"].items() if row["sent"]
    }
    assert made["hyperparameters"]["loss_fn"] == {
        "value": "ppo", "from": "serverless.loss_fn", "default": "ppo", "sent": False,
    }  # fmt: skip
    # No GPU cluster to pay for: the reward workers and the platform, the token charge apart.
    assert made["cost_per_hour_usd"] == round(
        estimate(load_training_config(SERVERLESS)).per_hour, 2
    )
    assert estimate(load_training_config(SERVERLESS)).gpu_per_hour == 0.0
    assert any("per-token price" in item for item in made["unverified"])


def test_the_readable_serverless_plan_prints_the_request_and_the_document() -> None:
    code, output = plan("--config", str(SERVERLESS), "--region", "us-east-1")
    assert code == 0, output
    for part in ('"JobCategory": "AgentRFT"', "JobConfigDocument:", '"S3DataType": "S3Prefix"',
                 "the final evaluation's CreateJob request", '"InputModelPackageArn"',
                 "hyperparameters", "unverified until a first run on AWS:"):  # fmt: skip
        assert part in output, part


def test_a_serverless_config_the_service_refuses_exits_1_with_each_reason(tmp_path: Path) -> None:
    config = yaml.safe_load(SERVERLESS.read_text(encoding="utf-8"))
    config |= {"max_new_tokens": 256, "kl_coefficient": 0.1}
    path = tmp_path / "refused.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    code, output = plan("--config", str(path), "--region", "us-east-1")
    assert code == 1 and "Traceback" not in output
    assert "cannot run as SageMaker's managed job" in output
    assert "kl_coefficient: the managed job's recipe has no KL term; set 0" in output
    assert "max_new_tokens is 256: the managed job's sampling_max_tokens must be >= 512" in output
    code, output = plan("--config", str(SERVERLESS), "--region", "us-east-1", "--recipe", str(path))
    assert code == 2 and "a serverless config has no HyperPod recipe" in output
