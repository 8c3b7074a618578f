"""The Nova training plane: the recipe AWS's launcher receives for a run (the Forge recipe read
from S3 with the run's overrides), the launcher function invoked in-process with the HyperPod CLI
and helm faked at their process boundary, the chart's PyTorchJob read back from a fake
Kubernetes API, the restricted group scaled through the recorded SageMaker fake."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml

from domain.backends import EvaluationUnsupported, Phase, RunContext
from domain.checkpoints import BaseCheckpoint
from domain.dataset import DatasetRecord, read_records
from domain.episodes import Episode, EvaluationStage
from domain.evaluation import held_out
from domain.nova_job import (
    FORGE_EVALUATION_RECIPE,
    NovaRefused,
    evaluation_image,
    images,
    run_name,
    submitted_recipe_key,
)
from lambdas.clients import Clients
from lambdas.pipeline.hyperpod_capacity import CapacityLeases, HyperPodCapacity
from lambdas.pipeline.nova_training import LaunchFailed, NovaSettings, NovaTrainingCluster
from lambdas.router.conversations import ConversationStore, create_table
from tests.aws import create_leases_table
from tests.forge_recipe import forge_evaluation_recipe, forge_recipe
from tests.kubernetes.fake_api import FakeKubernetes, client_of
from tests.launcher.fake_cli import PODS, PYTORCH_JOBS, FakeLauncherProcesses, InProcessLauncher
from tests.service_fakes import FakeEks, FakeSageMaker
from training_configs.schema import load_training_config

LAUNCHER = "nova-mtrl-nova-launcher"
# The deployment's rollout Lambda, unqualified (the form the Forge SDK passes): the run holds it.
ROLLOUT_LAMBDA = "arn:aws:lambda:us-east-1:123456789012:function:nova-mtrl-SageMaker-rollout"
QUEUES = {
    kind: f"https://sqs.us-east-1.amazonaws.com/123456789012/nova-mtrl-wordle-0a1b2c3d4e-{kind}.fifo"
    for kind in ("rollout_requests", "rollout_responses", "generate_requests",
                 "generate_responses", "dlq")
}  # fmt: skip
RUN = RunContext(
    run_id="wordle-0a1b2c3d4e",
    queues=QUEUES,
    router_url=None,
    run_token="",
    bucket="nova-mtrl-data",
    dataset_key="training-data/wordle.jsonl",
    dataset_version=None,
    output_prefix="runs/wordle-0a1b2c3d4e/",
    rollout_request_arn=ROLLOUT_LAMBDA,
    config=load_training_config("rft_multiturn_lora"),
)
NAME = run_name("nova-mtrl", RUN.run_id)
DATASET = b"".join(
    json.dumps({"id": f"w{i}", "metadata": {"prompt": "Play.", "answer": "crane"}}).encode() + b"\n"
    for i in range(40)
)
HELD_OUT = [
    f"w{i}"
    for i in range(40)
    if held_out(f"w{i}", fraction=RUN.training.held_out_fraction, seed=RUN.training.eval_seed)
]
SOURCE = "s3://forge-recipes/{recipe}.yaml"


def settings(**overrides: str) -> NovaSettings:
    return NovaSettings.model_validate(
        {
            "NAME_PREFIX": "nova-mtrl", "CAPACITY_LEASES_TABLE": "leases",
            "EKS_CLUSTER": "nova-mtrl-eks", "HYPERPOD_CLUSTER": "nova-mtrl",
            "NOVA_INSTANCE_GROUP": "nova", "NOVA_INSTANCE_TYPE": "ml.p5.48xlarge",
            "NOVA_LAUNCHER_FUNCTION": LAUNCHER, "NOVA_RECIPE_SOURCE": SOURCE,
            "CONVERSATIONS_TABLE": "conversations", "AWS_REGION": "us-east-1", **overrides,
        }
    )  # fmt: skip


class Plane:
    def __init__(self, cluster: NovaTrainingCluster, processes: FakeLauncherProcesses,
                 launcher: InProcessLauncher, sagemaker: FakeSageMaker,
                 reports: ConversationStore) -> None:  # fmt: skip
        self.cluster, self.processes = cluster, processes
        self.launcher, self.sagemaker, self.reports = launcher, sagemaker, reports


@pytest.fixture
def plane(aws: None, api: FakeKubernetes, tmp_path: Path) -> Iterator[Plane]:
    s3 = boto3.client("s3")
    for bucket in ("forge-recipes", RUN.bucket):
        s3.create_bucket(Bucket=bucket)
    key = "fine-tuning/nova/forge/nova_2_0/nova_lite/RFT/nova_lite_2_0_p5_gpu_lora_rft_byoo.yaml"
    s3.put_object(Bucket="forge-recipes", Key=key, Body=yaml.safe_dump(forge_recipe()).encode())
    s3.put_object(
        Bucket="forge-recipes", Key=f"{FORGE_EVALUATION_RECIPE}.yaml",
        Body=yaml.safe_dump(forge_evaluation_recipe()).encode(),
    )  # fmt: skip
    s3.put_object(Bucket=RUN.bucket, Key=RUN.dataset_key, Body=DATASET)
    db = boto3.client("dynamodb")
    create_leases_table(db, "leases")
    create_table(db, "conversations")
    reports = ConversationStore(db, "conversations")
    sagemaker = FakeSageMaker()
    processes = FakeLauncherProcesses(tmp_path / "recipes", kubernetes=api)
    # As in the image: the collection's Forge folder is a link into the (not yet made) workdir.
    (processes.recipes / "fine-tuning/nova").mkdir(parents=True)
    (processes.recipes / "fine-tuning/nova/forge").symlink_to(tmp_path / "work/forge")
    (processes.recipes / "evaluation/nova").mkdir(parents=True)
    (processes.recipes / "evaluation/nova/forge").symlink_to(tmp_path / "work/forge-evaluation")
    environment = {"EKS_CLUSTER": "nova-mtrl-eks", "AWS_REGION": "us-east-1",
                   "HYPERPOD_CLUSTER": "nova-mtrl",
                   "HYPERPOD_CONTEXT_FILE": str(tmp_path / "hyperpod_current_context.json"),
                   "HYPERPOD_RECIPES": str(processes.recipes),
                   "NEMO_LAUNCHER_SCRIPTS": "/opt/nemo/launcher_scripts",
                   "LAUNCHER_WORKDIR": str(tmp_path / "work")}  # fmt: skip
    capacity = HyperPodCapacity(
        sagemaker.client(), CapacityLeases(db, "leases"), cluster="nova-mtrl",
        instance_group="nova", restricted=True,
    )  # fmt: skip
    # The launcher's own clients (made inside) reach the fakes too: the EKS API and SageMaker.
    with (
        FakeEks(endpoint=api.endpoint, ca_data=api.ca_data).installed(),
        sagemaker.installed(),
    ):
        launcher = InProcessLauncher(processes, function=LAUNCHER, environment=environment)
        cluster = NovaTrainingCluster(
            settings(), kubernetes=client_of(api), capacity=capacity,
            lambda_client=launcher.client(), s3=s3, store=reports,
        )  # fmt: skip
        yield Plane(cluster, processes, launcher, sagemaker, reports)


def test_submit_hands_aws_launcher_the_forge_recipe_with_this_runs_overrides(
    plane: Plane, tmp_path: Path
) -> None:
    job = plane.cluster.submit(RUN)
    (recipe,) = plane.processes.recipes_read
    assert recipe["run"] == {
        "name": NAME, "model_name_or_path": "nova-lite-2/prod",
        "data_s3_path": "s3://nova-mtrl-data/runs/wordle-0a1b2c3d4e/data/training.jsonl",
        "output_s3_path": "s3://nova-mtrl-data/runs/wordle-0a1b2c3d4e/",
        "rollout_request_arn": ROLLOUT_LAMBDA,
        "rollout_response_sqs_url": QUEUES["rollout_responses"],
        "generate_request_sqs_url": QUEUES["generate_requests"],
        "generate_response_sqs_url": QUEUES["generate_responses"],
        "model_type": "amazon.nova-2-lite-v1:0:256k",
        "replicas": 4,  # the shipped LoRA config: 8 nodes, less 2 for vLLM and 2 for services
        "generation_replicas": RUN.training.generation_replicas, "rollout_worker_replicas": 1,
    }  # fmt: skip
    rollout = recipe["training_config"]["rollout"]
    assert rollout["advantage_strategy"]["number_generation"] == RUN.training.group_size
    assert rollout["delegate"] is True
    assert recipe["training_config"]["max_seq_length"] == RUN.training.max_length
    assert recipe["training_config"]["train"]["peft"]["lora_tuning"]["alpha"] == 64
    # What the job was started with, kept with the run: the SDK's own queue key found no leaf.
    kept = boto3.client("s3").get_object(
        Bucket=RUN.bucket, Key=submitted_recipe_key(RUN.output_prefix, NAME)
    )
    assert json.loads(kept["Body"].read()) == {
        "job": NAME, "skipped": ["rollout_request_queue_url"], "recipe": recipe
    }  # fmt: skip
    (started,) = plane.processes.started()
    assert started.argv == [
        "hyperpod", "start-job", "--namespace", "kubeflow", "--recipe",
        f"fine-tuning/nova/forge/nova_2_0/nova_lite/RFT/{NAME}", "--override-parameters",
        json.dumps({"instance_type": "ml.p5.48xlarge",
                    "container": images("us-east-1")["training"]}),
    ]  # fmt: skip
    assert (tmp_path / f"work/forge/nova_2_0/nova_lite/RFT/{NAME}.yaml").is_file()
    assert started.env["PYTHONPATH"] == "/opt/nemo/launcher_scripts"
    # The launcher ran with a kubeconfig for the cluster and an EKS token of its own.
    kubeconfig = yaml.safe_load(Path(started.env["KUBECONFIG"]).read_text())
    assert kubeconfig["clusters"][0]["cluster"]["server"] == plane.processes.kubernetes.endpoint
    assert kubeconfig["users"][0]["user"]["token"].startswith("k8s-aws-v1.")
    (release,) = plane.processes.releases
    assert job == f"kubeflow/{release}" and release.startswith(f"{NAME}-")
    # The cluster context `hyperpod connect-cluster` would have stored, which start-job reads
    # once the job is installed: SageMaker's description of the HyperPod cluster.
    context = json.loads((tmp_path / "hyperpod_current_context.json").read_text())
    assert (context["ClusterName"], context["ClusterArn"]) == ("nova-mtrl", plane.sagemaker.arn)
    assert "ResponseMetadata" not in context


def test_a_run_from_a_base_checkpoint_trains_on_from_it(plane: Plane) -> None:
    """Iterative training as the Forge SDK does it: `model_name_or_path` is the checkpoint."""
    base = BaseCheckpoint(uri="s3://customer-escrow/job-abcde/step_10", run_id="first-1")
    plane.cluster.submit(replace(RUN, base=base))
    (recipe,) = plane.processes.recipes_read
    assert recipe["run"]["model_name_or_path"] == "s3://customer-escrow/job-abcde/step_10"
    assert recipe["run"]["model_type"] == "amazon.nova-2-lite-v1:0:256k"


def test_a_retried_submit_starts_nothing_more(plane: Plane) -> None:
    assert plane.cluster.submit(RUN) == plane.cluster.submit(RUN)
    assert len(plane.processes.started()) == 1
    assert [payload["action"] for payload in plane.launcher.payloads] == ["start", "start"]


def _job(plane: Plane) -> dict[str, Any]:
    (job,) = plane.processes.kubernetes.objects[PYTORCH_JOBS].values()
    return job


def test_status_follows_the_charts_pytorchjob_and_its_pods(plane: Plane) -> None:
    assert plane.cluster.status(RUN).phase is Phase.FAILED  # nothing submitted: nothing to wait for
    plane.cluster.submit(RUN)
    job = _job(plane)
    name = job["metadata"]["name"]
    assert plane.cluster.status(RUN).phase is Phase.PENDING
    job["status"] = {"conditions": [{"type": "Running", "status": "True"}]}
    assert plane.cluster.status(RUN).phase is Phase.RUNNING
    pods = plane.processes.kubernetes.objects.setdefault(PODS, {})
    pulling = {"containerStatuses": [{"name": "vllm", "image": "nova:gen", "state": {
        "waiting": {"reason": "ImagePullBackOff", "message": "denied"}}}]}  # fmt: skip
    pods["someone-else-vllm-0"] = {"metadata": {"name": "someone-else-vllm-0"}, "status": pulling}
    assert plane.cluster.status(RUN).phase is Phase.RUNNING  # another job's pod is not ours
    pods[f"{name}-vllm-0"] = {"metadata": {"name": f"{name}-vllm-0"}, "status": pulling}
    failed = plane.cluster.status(RUN)
    assert failed.phase is Phase.FAILED
    assert (
        failed.reason
        == f"image pull failed for nova:gen (pod {name}-vllm-0, container vllm): denied"
    )
    del pods[f"{name}-vllm-0"]
    job["status"] = {"conditions": [{"type": "Succeeded", "status": "True"}]}
    assert plane.cluster.status(RUN).phase is Phase.SUCCEEDED


def test_delete_uninstalls_the_runs_release_and_is_idempotent(plane: Plane) -> None:
    plane.cluster.submit(RUN)
    assert plane.cluster.delete(RUN) == 1
    assert plane.processes.releases == {}
    assert plane.processes.kubernetes.objects[PYTORCH_JOBS] == {}
    assert plane.cluster.delete(RUN) == 0
    assert plane.cluster.status(RUN).phase is Phase.FAILED


def test_a_failed_launch_fails_the_submit_with_what_the_launcher_said(plane: Plane) -> None:
    plane.processes.install_fails = True
    with pytest.raises(LaunchFailed, match=f"^the launcher could not start {NAME}: hyperpod "
                       f"start-job started no job for {NAME}: Error: INSTALLATION FAILED"):  # fmt: skip
        plane.cluster.submit(RUN)


def test_a_key_the_recipe_lacks_is_skipped_and_kept_with_the_run_as_the_sdk_skips_it(
    plane: Plane,
) -> None:
    recipe = forge_recipe()
    del recipe["training_config"]["train"]["peft"]
    key = "fine-tuning/nova/forge/nova_2_0/nova_lite/RFT/nova_lite_2_0_p5_gpu_lora_rft_byoo.yaml"
    boto3.client("s3").put_object(Bucket="forge-recipes", Key=key, Body=yaml.safe_dump(recipe))
    plane.cluster.submit(RUN)
    (started,) = plane.processes.recipes_read
    assert "peft" not in started["training_config"]["train"]  # never added
    kept = boto3.client("s3").get_object(
        Bucket=RUN.bucket, Key=submitted_recipe_key(RUN.output_prefix, NAME)
    )
    assert json.loads(kept["Body"].read())["skipped"] == ["alpha", "rollout_request_queue_url"]


def test_a_recipe_that_does_not_delegate_is_refused_before_anything_starts(plane: Plane) -> None:
    recipe = forge_recipe()
    del recipe["training_config"]["rollout"]["delegate"]
    key = "fine-tuning/nova/forge/nova_2_0/nova_lite/RFT/nova_lite_2_0_p5_gpu_lora_rft_byoo.yaml"
    boto3.client("s3").put_object(Bucket="forge-recipes", Key=key, Body=yaml.safe_dump(recipe))
    with pytest.raises(NovaRefused, match=f"^recipe {SOURCE.format(recipe=key[:-5])} has no "
                       "delegate: it is not a BYOO recipe"):  # fmt: skip
        plane.cluster.submit(RUN)
    assert plane.launcher.payloads == []
    plane.cluster.settings = settings(NOVA_RECIPE_SOURCE="https://example.com/{recipe}.yaml")
    with pytest.raises(NovaRefused, match="is not an s3://bucket/key URI"):
        plane.cluster.submit(RUN)


def test_the_restricted_group_is_scaled_for_the_run(plane: Plane) -> None:
    plane.cluster.scale_up(RUN, instances=4)
    (update,) = plane.sagemaker.operations("UpdateCluster")
    assert [g["InstanceCount"] for g in update["RestrictedInstanceGroups"]] == [4]
    assert "InstanceGroups" not in update
    plane.cluster.scale_down(RUN)
    assert plane.sagemaker.restricted[0]["TargetCount"] == 0


def test_made_from_its_environment_it_scales_submits_watches_and_stops(
    aws: None, tmp_path: Path
) -> None:
    """As the pipeline's functions make it (lambdas/pipeline/composition.py): the restricted
    group's leases and capacity, the launcher function, the recipes' bucket, and the EKS API
    with a token of its own."""
    api = FakeKubernetes(
        authenticate=lambda token: "pipeline" if token.startswith("k8s-aws-v1.") else None
    )
    with api:
        s3 = boto3.client("s3")
        for bucket in ("forge-recipes", RUN.bucket):
            s3.create_bucket(Bucket=bucket)
        key = (
            "fine-tuning/nova/forge/nova_2_0/nova_lite/RFT/nova_lite_2_0_p5_gpu_lora_rft_byoo.yaml"
        )
        s3.put_object(Bucket="forge-recipes", Key=key, Body=yaml.safe_dump(forge_recipe()).encode())
        s3.put_object(Bucket=RUN.bucket, Key=RUN.dataset_key, Body=DATASET)
        create_leases_table(boto3.client("dynamodb"), "leases")
        create_table(boto3.client("dynamodb"), "conversations")
        processes = FakeLauncherProcesses(tmp_path / "recipes", kubernetes=api)
        image = {"EKS_CLUSTER": "nova-mtrl-eks", "AWS_REGION": "us-east-1",
                 "HYPERPOD_CLUSTER": "nova-mtrl",
                 "HYPERPOD_CONTEXT_FILE": str(tmp_path / "hyperpod_current_context.json"),
                 "HYPERPOD_RECIPES": str(processes.recipes), "NEMO_LAUNCHER_SCRIPTS": "/opt/nemo",
                 "LAUNCHER_WORKDIR": str(tmp_path / "work")}  # fmt: skip
        sagemaker = FakeSageMaker()
        with (
            FakeEks(endpoint=api.endpoint, ca_data=api.ca_data).installed(),
            sagemaker.installed(),
            InProcessLauncher(processes, function=LAUNCHER, environment=image).installed(),
        ):
            environment = {
                key: str(value) for key, value in settings().model_dump(by_alias=True).items()
            }
            cluster = NovaTrainingCluster.from_environment(
                environment, Clients(boto3.Session(region_name="us-east-1"))
            )
            cluster.scale_up(RUN, instances=2)
            (update,) = sagemaker.operations("UpdateCluster")
            assert [g["InstanceCount"] for g in update["RestrictedInstanceGroups"]] == [2]
            job = cluster.submit(RUN)
            assert processes.recipes_read[0]["run"]["name"] == NAME
            assert cluster.status(RUN).phase is Phase.PENDING
            assert job == f"kubeflow/{next(iter(processes.releases))}"
            assert cluster.delete(RUN) == 1 and processes.releases == {}
            # Only the restricted group's nodes that Kubernetes can schedule on count.
            api.objects["/api/v1/nodes"] = {
                name: {"metadata": {"name": name, "labels": {
                    "node.kubernetes.io/instance-type": kind,
                    "sagemaker.amazonaws.com/node-health-status": "Schedulable"}},
                    "spec": {"unschedulable": cordoned},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
                for name, kind, cordoned in (("a", "ml.p5.48xlarge", False),
                                             ("b", "ml.p5.48xlarge", True),
                                             ("c", "ml.g5.48xlarge", False))
            }  # fmt: skip
            assert cluster.nodes_ready(RUN) == 1


def test_a_run_without_the_rollout_lambda_or_a_recipe_that_is_no_mapping_is_refused(
    plane: Plane,
) -> None:
    with pytest.raises(
        ValueError,
        match=r"^run wordle-0a1b2c3d4e: it does not hold the rollout Lambda \(Provision\)$",
    ):
        plane.cluster.recipe(replace(RUN, rollout_request_arn=None))
    with pytest.raises(
        ValueError,
        match=r"^run wordle-0a1b2c3d4e: it does not hold the rollout Lambda \(Provision\)$",
    ):
        plane.cluster.evaluation_recipe(
            replace(RUN, rollout_request_arn=None), EvaluationStage.BASELINE
        )
    key = "fine-tuning/nova/forge/nova_2_0/nova_lite/RFT/nova_lite_2_0_p5_gpu_lora_rft_byoo.yaml"
    boto3.client("s3").put_object(Bucket="forge-recipes", Key=key, Body=b"- a list\n")
    with pytest.raises(
        NovaRefused, match=f"^recipe s3://forge-recipes/{key}: expected a YAML mapping$"
    ):
        plane.cluster.recipe(RUN)


def test_status_reads_the_latest_job_of_the_run_and_its_reward_curve(plane: Plane) -> None:
    """A job left by an earlier attempt (an older release of the same run) is not the one
    followed; the step is the run's reward curve, made from the rollout reports the router
    accepted (a Nova job writes no metrics of ours), its last short window once the job ended."""
    assert plane.cluster.status(RUN).reason == "the run's Nova job is not in namespace kubeflow"
    jobs = plane.processes.kubernetes.objects.setdefault(PYTORCH_JOBS, {})
    for suffix, created, condition in (
        ("old01", "2026-12-01T10:00:00Z", "Failed"),
        ("new01", "2026-12-01T11:00:00Z", "Running"),
    ):
        jobs[f"{NAME}-{suffix}"] = {
            "metadata": {"name": f"{NAME}-{suffix}", "creationTimestamp": created},
            "status": {"conditions": [{"type": condition, "status": "True"}]},
        }  # fmt: skip
    status = plane.cluster.status(RUN)
    assert (status.phase, status.step) == (Phase.RUNNING, None)  # no rollout reported yet
    size = RUN.training.global_batch_size
    for index in range(2 * size + 3):
        plane.reports.record_report(
            RUN.run_id, f"m{index}", episode=Episode(
                record_id="r", sample_id=f"r_{index}", stop_reason="end_of_conversation",
                score=index % 2, success=index % 2 == 1,
            ), stage=None, now=float(index),
        )  # fmt: skip
    status = plane.cluster.status(RUN)
    assert (status.phase, status.step) == (Phase.RUNNING, 2)
    metrics = (
        boto3.client("s3")
        .get_object(Bucket=RUN.bucket, Key=f"{RUN.output_prefix}metrics.jsonl")["Body"]
        .read()
    )
    first, second = (json.loads(line) for line in metrics.splitlines())
    assert (first["rollouts"], first["mean_reward"], first["pass_rate"]) == (size, 0.5, 0.5)
    assert second["first_report_at"] == float(size)
    jobs[f"{NAME}-new01"]["status"] = {"conditions": [{"type": "Succeeded", "status": "True"}]}
    status = plane.cluster.status(RUN)
    assert (status.phase, status.step) == (Phase.SUCCEEDED, 3)


def ndjson(uri: str) -> bool:
    """The object at `uri` says it is JSON lines."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    head = boto3.client("s3").head_object(Bucket=bucket, Key=key)
    return head["ContentType"] == "application/x-ndjson"


def records_at(uri: str) -> list[DatasetRecord]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    body = boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    return list(read_records(io.BytesIO(body)))


def test_the_job_never_trains_on_the_held_out_records(plane: Plane) -> None:
    """With a share held out, the job's data is the dataset without exactly those records (as
    the local trainer skips them); with none, the dataset itself."""
    assert 0 < len(HELD_OUT) < 40
    plane.cluster.submit(RUN)
    (recipe,) = plane.processes.recipes_read
    trained = [record.id for record in records_at(recipe["run"]["data_s3_path"])]
    assert trained == [f"w{i}" for i in range(40) if f"w{i}" not in HELD_OUT]
    config = RUN.training.model_copy(update={"eval_fraction": 0.0})
    assert plane.cluster.training_data(replace(RUN, config=config)) == (
        f"s3://{RUN.bucket}/{RUN.dataset_key}"
    )


def evaluation_recipe(plane: Plane, stage: EvaluationStage) -> dict[str, Any]:
    name = run_name("nova-mtrl", RUN.run_id, stage)
    (recipe,) = [r for r in plane.processes.recipes_read if r["run"]["name"] == name]
    return recipe


def test_the_baseline_evaluation_is_awss_recipe_on_the_held_out_records_through_the_runs_queues(
    plane: Plane, tmp_path: Path
) -> None:
    job = plane.cluster.submit_evaluation(RUN, stage=EvaluationStage.BASELINE)
    name = run_name("nova-mtrl", RUN.run_id, "baseline")
    assert name == f"{NAME}-eval-b"  # whole: the run's name and the stage, within the cut
    assert job.startswith(f"kubeflow/{name}-")
    recipe = evaluation_recipe(plane, EvaluationStage.BASELINE)
    assert recipe["run"] | {"data_s3_path": None} == {
        "name": name, "model_type": "amazon.nova-2-lite-v1:0:256k",
        "model_name_or_path": "nova-lite-2/prod", "replicas": 1, "data_s3_path": None,
        "output_s3_path": f"s3://nova-mtrl-data/{RUN.output_prefix}evaluation/baseline/",
        "mlflow_tracking_uri": "", "mlflow_experiment_name": "", "mlflow_run_name": "",
    }  # fmt: skip
    evaluated = [record.id for record in records_at(recipe["run"]["data_s3_path"])]
    assert evaluated == HELD_OUT[: RUN.training.eval_max_records]
    assert recipe["evaluation"] == {"task": "rft_eval", "strategy": "rft_eval", "metric": "all"}
    assert recipe["rl_env"] == {  # the SDK drops the single-turn reward Lambda
        "rollout_request_arn": ROLLOUT_LAMBDA,  # the same Lambda: the phase tells apart
        "rollout_response_sqs_url": QUEUES["rollout_responses"],
        "rollout_request_queue_url": QUEUES["rollout_requests"],
        "generate_request_sqs_url": QUEUES["generate_requests"],
        "generate_response_sqs_url": QUEUES["generate_responses"],
    }
    assert recipe["inference"] == forge_evaluation_recipe()["inference"]  # AWS's, untouched
    (started,) = plane.processes.started()
    assert started.argv[4:] == [
        "--recipe", f"evaluation/nova/forge/nova_2_0/nova_lite/{name}", "--override-parameters",
        json.dumps({"instance_type": "ml.p5.48xlarge",
                    "container": "708977205387.dkr.ecr.us-east-1.amazonaws.com/"
                                 "nova-evaluation-repo:SM-HP-Eval-V2-latest"}),
    ]  # fmt: skip
    assert (tmp_path / f"work/forge-evaluation/nova_2_0/nova_lite/{name}.yaml").is_file()
    # Again (a retried step): the same job.
    assert plane.cluster.submit_evaluation(RUN, stage=EvaluationStage.BASELINE) == job
    assert len(plane.processes.started()) == 1


def test_a_named_evaluation_file_is_evaluated_whole_and_training_keeps_every_record(
    plane: Plane,
) -> None:
    lines = b"".join(
        json.dumps({"id": f"held-{i}", "metadata": {"prompt": "Play.", "answer": "slate"}}).encode()
        + b"\n"
        for i in range(3)
    )
    boto3.client("s3").put_object(Bucket=RUN.bucket, Key="evaluation-data/w.jsonl", Body=lines)
    config = RUN.training.model_copy(update={"eval_dataset": "evaluation-data/w.jsonl"})
    run = replace(RUN, config=config)
    assert plane.cluster.training_data(run) == f"s3://{RUN.bucket}/{RUN.dataset_key}"
    plane.cluster.submit_evaluation(run, stage=EvaluationStage.BASELINE)
    recipe = evaluation_recipe(plane, EvaluationStage.BASELINE)
    assert [r.id for r in records_at(recipe["run"]["data_s3_path"])] == [
        "held-0",
        "held-1",
        "held-2",
    ]


def test_the_final_evaluation_is_of_the_checkpoint_training_ended_with(plane: Plane) -> None:
    stage = EvaluationStage.FINAL
    with pytest.raises(EvaluationUnsupported, match="recorded no checkpoint with a location"):
        plane.cluster.submit_evaluation(RUN, stage=stage)
    assert plane.processes.started() == []
    s3 = boto3.client("s3")
    for job, created in (("job-1", "step_5"), ("job-2", "step_9")):
        s3.put_object(
            Bucket=RUN.bucket, Key=f"{RUN.output_prefix}{NAME}-{job}/manifest.json",
            Body=json.dumps({"checkpoint_s3_bucket": f"s3://escrow/{job}/{created}"}).encode(),
        )  # fmt: skip
    plane.cluster.submit_evaluation(RUN, stage=stage)
    recipe = evaluation_recipe(plane, stage)
    assert recipe["run"]["model_name_or_path"] == "s3://escrow/job-2/step_9"
    assert recipe["rl_env"]["rollout_request_arn"] == ROLLOUT_LAMBDA
    # A run that started from a checkpoint evaluates that one as its baseline.
    base = BaseCheckpoint(uri="s3://escrow/first/step_3", run_id="first-1")
    plane.cluster.submit_evaluation(replace(RUN, base=base), stage=EvaluationStage.BASELINE)
    assert evaluation_recipe(plane, EvaluationStage.BASELINE)["run"]["model_name_or_path"] == (
        "s3://escrow/first/step_3"
    )


def test_where_aws_cannot_evaluate_the_run_goes_on_and_says_why(plane: Plane) -> None:
    plane.cluster.settings = settings(AWS_REGION="eu-central-1")
    assert evaluation_image("eu-central-1") is None
    with pytest.raises(EvaluationUnsupported) as unsupported:
        plane.cluster.submit_evaluation(RUN, stage=EvaluationStage.BASELINE)
    assert str(unsupported.value) == (
        "AWS publishes no Nova evaluation image in eu-central-1; evaluate the model with the Nova "
        "Forge SDK (RFT_MULTITURN_EVAL) in a region that has one"
    )
    plane.cluster.settings = settings()
    recipe = forge_evaluation_recipe()
    del recipe["rl_env"]["rollout_request_arn"], recipe["rl_env"]["generate_request_sqs_url"]
    boto3.client("s3").put_object(
        Bucket="forge-recipes", Key=f"{FORGE_EVALUATION_RECIPE}.yaml", Body=yaml.safe_dump(recipe)
    )
    with pytest.raises(EvaluationUnsupported) as unsupported:
        plane.cluster.submit_evaluation(RUN, stage=EvaluationStage.BASELINE)
    assert str(unsupported.value) == (
        f"AWS's evaluation recipe s3://forge-recipes/{FORGE_EVALUATION_RECIPE}.yaml has no "
        "rollout_request_arn, generate_request_sqs_url: it cannot play its rollouts through this "
        "run's reward workers"
    )
    assert plane.launcher.payloads == []
    boto3.client("s3").put_object(
        Bucket="forge-recipes", Key=f"{FORGE_EVALUATION_RECIPE}.yaml",
        Body=yaml.safe_dump(forge_evaluation_recipe()),
    )  # fmt: skip
    none_held = b"".join(line + b"\n" for line in DATASET.splitlines()[1:4])  # w0 is held out
    boto3.client("s3").put_object(Bucket=RUN.bucket, Key=RUN.dataset_key, Body=none_held)
    with pytest.raises(EvaluationUnsupported) as unsupported:
        plane.cluster.submit_evaluation(RUN, stage=EvaluationStage.BASELINE)
    assert str(unsupported.value) == (
        "no record of s3://nova-mtrl-data/training-data/wordle.jsonl is held out for evaluation "
        "(eval_fraction 0.1); raise eval_fraction or name an eval_dataset"
    )
    assert plane.launcher.payloads == []


def test_an_evaluation_recipe_without_the_sdks_other_leaves_runs_and_keeps_what_it_skipped(
    plane: Plane,
) -> None:
    """A recipe mismatch never fails a run: the task, strategy, metric and the SDK's own queue
    key are skipped where the evaluation recipe lacks them (as the SDK skips them), and kept
    with the run; only the four BYOO endpoints are needed (above)."""
    recipe = forge_evaluation_recipe()
    del recipe["evaluation"], recipe["rl_env"]["rollout_request_queue_url"]
    boto3.client("s3").put_object(
        Bucket="forge-recipes", Key=f"{FORGE_EVALUATION_RECIPE}.yaml", Body=yaml.safe_dump(recipe)
    )
    job = plane.cluster.submit_evaluation(RUN, stage=EvaluationStage.BASELINE)
    name = run_name("nova-mtrl", RUN.run_id, "baseline")
    assert job.startswith(f"kubeflow/{name}-")
    started = evaluation_recipe(plane, EvaluationStage.BASELINE)
    assert "evaluation" not in started and "rollout_request_queue_url" not in started["rl_env"]
    kept = boto3.client("s3").get_object(
        Bucket=RUN.bucket, Key=submitted_recipe_key(RUN.output_prefix, name)
    )
    assert json.loads(kept["Body"].read())["skipped"] == [
        "task", "strategy", "metric", "rollout_request_queue_url"
    ]  # fmt: skip


def test_an_evaluation_that_succeeded_leaves_the_episodes_asked_for_in_its_phase(
    plane: Plane,
) -> None:
    stage = EvaluationStage.BASELINE
    missing = plane.cluster.evaluation_status(RUN, stage=stage)
    assert missing.reason == "the run's baseline evaluation is not in namespace kubeflow"
    plane.cluster.submit_evaluation(RUN, stage=stage)
    (job,) = plane.processes.kubernetes.objects[PYTORCH_JOBS].values()
    assert plane.cluster.evaluation_status(RUN, stage=stage).phase is Phase.PENDING
    job["status"] = {"conditions": [{"type": "Succeeded", "status": "True"}]}
    nothing = plane.cluster.evaluation_status(RUN, stage=stage)
    assert (nothing.phase, nothing.reason) == (
        Phase.FAILED,
        "AWS's baseline evaluation job succeeded but no rollout of it reached the run's reward "
        "workers (the rollout Lambda was never invoked in its phase)",
    )
    episodes = [
        Episode(record_id=f"w{i}", sample_id=f"w{i}_0", stop_reason="end_of_conversation",
                score=0.5 * i, success=i == 1, turns=3.0)
        for i in range(2)
    ]  # fmt: skip
    for index, episode in enumerate(episodes):
        plane.reports.record_report(
            RUN.run_id, f"e{index}", episode=episode, stage=stage, now=index
        )
    plane.reports.record_report(  # training's and the other evaluation's are not this one's
        RUN.run_id, "t", episode=episodes[0], stage=None, now=5.0
    )
    plane.reports.record_report(
        RUN.run_id, "f", episode=episodes[0], stage=EvaluationStage.FINAL, now=6.0
    )
    assert plane.cluster.evaluation_status(RUN, stage=stage).phase is Phase.SUCCEEDED
    body = (
        boto3.client("s3")
        .get_object(Bucket=RUN.bucket, Key=f"{RUN.output_prefix}evaluation/baseline.jsonl")["Body"]
        .read()
    )
    assert [Episode.model_validate_json(line) for line in body.splitlines()] == episodes
    assert ndjson(f"s3://{RUN.bucket}/{RUN.output_prefix}evaluation/baseline.jsonl")
    # The training job's status is not the evaluation's.
    assert plane.cluster.status(RUN).phase is Phase.FAILED


def test_delete_uninstalls_the_evaluations_too(plane: Plane) -> None:
    plane.cluster.submit(RUN)
    plane.cluster.submit_evaluation(RUN, stage=EvaluationStage.BASELINE)
    assert len(plane.processes.releases) == 2
    assert plane.cluster.delete(RUN) == 2
    assert plane.processes.releases == {}
    stops = [p["name"] for p in plane.launcher.payloads if p["action"] == "stop"]
    assert stops == [NAME, *(run_name("nova-mtrl", RUN.run_id, s) for s in EvaluationStage)]


def test_the_records_are_those_of_the_dataset_version_that_started_the_run(plane: Plane) -> None:
    """The upload that started the run, not the file as it is now; each record written as it
    was given (no field added), as JSON lines."""
    s3 = boto3.client("s3")
    s3.put_bucket_versioning(Bucket=RUN.bucket, VersioningConfiguration={"Status": "Enabled"})
    first = s3.put_object(Bucket=RUN.bucket, Key=RUN.dataset_key, Body=DATASET)["VersionId"]
    s3.put_object(Bucket=RUN.bucket, Key=RUN.dataset_key, Body=DATASET.splitlines()[5] + b"\n")
    run = replace(RUN, dataset_version=first)
    training = plane.cluster.training_data(run)
    assert len(records_at(training)) == 40 - len(HELD_OUT) and ndjson(training)
    bucket, _, key = training.removeprefix("s3://").partition("/")
    written = s3.get_object(Bucket=bucket, Key=key)["Body"].read().splitlines()
    assert json.loads(written[0]) == json.loads(DATASET.splitlines()[1])  # w1: w0 is held out
    plane.cluster.submit_evaluation(run, stage=EvaluationStage.BASELINE)
    evaluated = evaluation_recipe(plane, EvaluationStage.BASELINE)["run"]["data_s3_path"]
    assert [r.id for r in records_at(evaluated)] == HELD_OUT[: RUN.training.eval_max_records]
    assert ndjson(evaluated)


def test_the_trained_checkpoint_is_found_behind_more_than_a_page_of_outputs(plane: Plane) -> None:
    """AWS's evaluation results sort before the job's manifest: past ListObjectsV2's first
    1,000 keys, the manifest is still found (every page is read)."""
    s3 = boto3.client("s3")
    for index in range(1000):
        s3.put_object(Bucket=RUN.bucket, Key=f"{RUN.output_prefix}evaluation/baseline/r{index:04}")
    s3.put_object(
        Bucket=RUN.bucket, Key=f"{RUN.output_prefix}{NAME}-job-9/manifest.json",
        Body=json.dumps({"checkpoint_s3_bucket": "s3://escrow/job-9/step_4"}).encode(),
    )  # fmt: skip
    assert plane.cluster.evaluated_model(RUN, EvaluationStage.FINAL) == "s3://escrow/job-9/step_4"
