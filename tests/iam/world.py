"""The deployed app, offline, with every principal its own: the pipeline stack deployed into moto
with each function signing as its role, the compute stack's fleet base and the HyperPod and EKS
fakes behind real botocore clients, a Kubernetes API that authenticates EKS tokens — and every
AWS and Kubernetes request recorded with who made it.

The compute backends are the deployed ones ("aws"), made by each function from its own
environment as on Lambda: nothing is injected.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import re
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import boto3
import yaml
from botocore.credentials import Credentials
from moto import mock_aws

from domain.agent_rft import AgentRolloutRequest, RolloutMetadata, runtime_endpoint
from domain.backends import METRICS_OBJECT
from domain.bucket import download_folder, trajectories_prefix
from domain.checkpoints import step_checkpoint_name
from domain.episodes import Episode, EvaluationStage
from domain.evaluation import write_episodes
from domain.naming import RUN_TAG, run_namespace
from domain.nova_job import FORGE_EVALUATION_RECIPE, FORGE_RECIPE_SOURCE, FORGE_RECIPES, job_pattern
from domain.protocol import Metric, RolloutRequest, RolloutResponse, dump
from domain.run_queues import QueueKind, queue_name
from domain.trainer_job import (
    evaluation_records_of,
    job_from_environment,
    metrics_lines_of,
    training_records_of,
)
from lambdas.clients import Clients, Compose, Handler
from lambdas.kubernetes import bootstrap, chart_install
from lambdas.kubernetes.bootstrap import RESPONSE_BUCKET
from lambdas.kubernetes.token import CLUSTER_HEADER, PREFIX
from lambdas.kubernetes.training_job import SETTINGS
from lambdas.launcher.handler import compose as compose_launcher
from lambdas.pipeline.steps import STEP
from llm_trainer.checkpoints import FINAL, CheckpointStore
from llm_trainer.generation import Sampled
from llm_trainer.hub_token import hub_token
from llm_trainer.service import GenerationService
from llm_trainer.tiny import tiny_tokenizer
from local_trainer.scripted import ScriptedTrainer
from mtrl.local.embedded import (
    Dispatcher,
    LocalPipeline,
    composed_handler,
    deploy_pipeline,
    function_environment,
    in_process_lambdas,
    matches,
    upload_event,
)
from mtrl.local.function_url import FunctionUrlServer
from mtrl.local.job_runtime import JobRuntimeStandIn
from mtrl.local.physical import ACCOUNT, REGION
from mtrl.ops.doctor import TOTAL_INSTANCES
from reward_envs.wordle import load_environment
from reward_envs.worker.agent_mode import AgentMode
from reward_envs.worker.job_runtime import job_runtime_clients
from reward_envs.worker.router_client import RouterClient, RouterRolloutQueues
from reward_envs.worker.settings import WorkerSettings
from reward_envs.worker.trajectory_store import TrajectoryStore, s3_put
from reward_envs.worker.worker import RewardWorker
from stacks.components.router import FORWARDER_HANDLER, PROXY_HANDLER
from tests.conftest import Synthesized
from tests.executions import finished
from tests.forge_recipe import forge_evaluation_recipe, forge_recipe
from tests.iam.authorization import Directory
from tests.iam.deployment import Deployment
from tests.iam.recorder import SECRET, Recorder
from tests.kubernetes.fake_api import FakeKubernetes
from tests.launcher.fake_cli import PODS, PYTORCH_JOBS, FakeLauncherProcesses
from tests.mlflow_fake import FakeMlflowServer
from tests.service_fakes import (
    FakeBedrock,
    FakeEks,
    FakeManagedJobs,
    FakeSageMaker,
    FakeSageMakerHosting,
    FakeServiceQuotas,
    every_client,
)

HARNESS_KEYS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
HUB_TOKEN = "hf_the-deployments-token"
CLIENTS = (
    "iam", "dynamodb", "sns", "lambda", "stepfunctions", "s3", "sqs", "cloudwatch", "ecs",
    "sagemaker",
)  # fmt: skip


@dataclass
class World:
    app: Synthesized
    deployment: Deployment
    recorder: Recorder
    pipeline: LocalPipeline
    harness: boto3.Session  # the tests' own (uploads, inspection), not a principal of the app
    clients: dict[str, Any]  # the harness's clients
    kubernetes: FakeKubernetes
    sagemaker: FakeSageMaker
    eks: FakeEks
    bedrock: FakeBedrock  # custom models and deployments `mtrl deploy` makes
    hosting: FakeSageMakerHosting  # the SageMaker endpoints `mtrl deploy --to sagemaker` makes
    managed_jobs: FakeManagedJobs  # serverless runs' managed jobs
    directory: Directory
    inbox: str
    launcher: FakeLauncherProcesses  # the HyperPod CLI and helm the launcher function runs
    mlflow: FakeMlflowServer  # the deployment's managed MLflow tracking server
    # CloudFormation's response bucket (an AWS service): what the custom resources answered, by
    # the pre-signed URL their event gave.
    cloudformation: dict[str, dict[str, Any]] = field(default_factory=dict)
    physical_ids: dict[str, str] = field(default_factory=dict)  # custom resources' answers

    def function(self, handler: str) -> str:
        return self.pipeline.function(handler)

    def invoke(self, handler: str, event: dict[str, Any]) -> Any:
        """Invoke a function as its trigger would (EventBridge, a schedule, a CLI)."""
        return self.pipeline.dispatcher.call(self.function(handler), event)

    def upload(
        self, key: str, body: bytes, metadata: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """A dataset lands under training-data/: the rule starts the run."""
        bucket = self.pipeline.data_bucket
        version = self.clients["s3"].put_object(
            Bucket=bucket, Key=key, Body=body, Metadata=metadata or {}
        )["VersionId"]
        event = upload_event(bucket, key, version)
        assert matches(self.pipeline.upload_pattern, event)
        return self.invoke(STEP["start_run"].handler, event)

    def finish(self, execution_arn: str) -> dict[str, Any]:
        return finished(self.clients["stepfunctions"], execution_arn, timeout=120)

    def notifications(self) -> list[str]:
        answer = self.clients["sqs"].receive_message(QueueUrl=self.inbox, MaxNumberOfMessages=10)
        return [message["Body"] for message in answer.get("Messages", [])]


def eks_user(recorder: Recorder, cluster: str):  # type: ignore[no-untyped-def]
    """EKS's authenticator: the principal whose credentials presigned the token's STS
    GetCallerIdentity, for this cluster (signed `x-k8s-aws-id` header), else None."""

    def authenticate(token: str) -> str | None:
        if not token.startswith(PREFIX):
            return None
        encoded = token.removeprefix(PREFIX)
        url = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
        query = parse_qs(urlsplit(url).query)
        if (
            query.get("Action") != ["GetCallerIdentity"]
            or CLUSTER_HEADER not in query.get("X-Amz-SignedHeaders", [""])[0]
        ):
            return None
        if urlsplit(url).hostname != f"sts.{REGION}.amazonaws.com":
            return None
        access_key = query["X-Amz-Credential"][0].split("/")[0]
        return recorder.principal_of(access_key)

    return authenticate


def _api_shape(value: Any) -> Any:
    """A CloudFormation ECS property (PascalCase) as the ECS API spells it (camelCase)."""
    if isinstance(value, list):
        return [_api_shape(item) for item in value]
    if isinstance(value, dict):
        return {
            key[0].lower() + key[1:]: item if key == "Options" else _api_shape(item)
            for key, item in value.items()
        }
    return value


def _deploy_compute(deployment: Deployment) -> dict[str, Any]:
    """What the pipeline's functions find of the compute stack: the reward fleet's cluster and
    base task definition (moto), and the HyperPod cluster's instance groups."""
    ecs = boto3.client("ecs")
    for stack, logical_id, _ in deployment.resources("AWS::ECS::Cluster"):
        ecs.create_cluster(clusterName=deployment.names[stack][logical_id]["Ref"])
    for stack, _, resource in deployment.resources("AWS::ECS::TaskDefinition"):
        properties = _api_shape(deployment.resolve(stack, resource["Properties"]))
        properties.pop("tags", None)
        ecs.register_task_definition(**properties)
    ((stack, logical_id, cluster),) = deployment.resources("AWS::SageMaker::Cluster")
    properties = deployment.resolve(stack, cluster["Properties"])
    groups = [
        {
            **{k: v for k, v in group.items() if k not in ("InstanceCount",)},
            "TargetCount": group["InstanceCount"],
            "CurrentCount": group["InstanceCount"],
            "Status": "InService",
            # What an operator may have set on the group since: kept by every update.
            "KubernetesConfig": {
                "CurrentLabels": {"team": "rl"},
                "DesiredLabels": {"team": "rl"},
                "CurrentTaints": [],
                "DesiredTaints": [],
            },
        }
        for group in properties["InstanceGroups"]
    ]
    restricted = [
        {
            **{k: v for k, v in group.items() if k not in ("InstanceCount",)},
            "TargetCount": group["InstanceCount"],
            "CurrentCount": group["InstanceCount"],
            "Status": "InService",
        }
        for group in properties.get("RestrictedInstanceGroups", [])
    ]
    return {
        "name": properties["ClusterName"],
        "arn": deployment.names[stack][logical_id]["ClusterArn"],
        "groups": groups,
        "restricted": restricted,
    }


def _deploy_compute_functions(
    deployment: Deployment,
    dispatcher: Dispatcher,
    credentials: Callable[[str], dict[str, str]],
    composers: Mapping[str, Compose],
) -> None:
    """The compute stack's functions (the chart's installer), as deployed: their environment,
    each signing as its role."""
    for stack, logical_id, resource in deployment.resources("AWS::Lambda::Function"):
        if not stack.endswith("-compute"):
            continue
        properties = resource["Properties"]
        resolve = functools.partial(deployment.resolve, stack)
        variables = function_environment(properties, resolve)
        variables |= credentials(str(resolve(properties["Role"])))
        name, handler = deployment.names[stack][logical_id]["Ref"], properties["Handler"]
        dispatcher.add(name, handler, composed_handler(handler, variables, composers=composers))


def _directory(deployment: Deployment) -> Directory:
    """Which key encrypts what, as the templates deploy it."""
    directory = Directory()
    for stack, logical_id, resource in deployment.resources("AWS::S3::Bucket"):
        properties = deployment.resolve(stack, resource["Properties"])
        for rule in properties.get("BucketEncryption", {}).get(
            "ServerSideEncryptionConfiguration", []
        ):
            key = rule["ServerSideEncryptionByDefault"].get("KMSMasterKeyID")
            if key:
                directory.keys[deployment.names[stack][logical_id]["Arn"]] = key
    for stack, logical_id, resource in deployment.resources("AWS::DynamoDB::Table"):
        key = (
            deployment.resolve(stack, resource["Properties"])
            .get("SSESpecification", {})
            .get("KMSMasterKeyId")
        )
        if key:
            directory.keys[deployment.names[stack][logical_id]["Arn"]] = key
    for stack, logical_id, resource in deployment.resources("AWS::SNS::Topic"):
        key = deployment.resolve(stack, resource["Properties"]).get("KmsMasterKeyId")
        if key:
            directory.keys[deployment.names[stack][logical_id]["TopicArn"]] = key
    for stack, logical_id, resource in deployment.resources("AWS::Lambda::Function"):
        names = deployment.names[stack][logical_id]
        directory.function_roles[names["Arn"]] = str(
            deployment.resolve(stack, resource["Properties"]["Role"])
        )
    return directory


def fargate_runs_what_is_wanted(parsed: dict[str, Any], **_: Any) -> None:
    """moto's ECS starts no tasks: a service's wanted tasks are reported running, as Fargate
    would once they start (what DescribeServices can answer)."""
    for service in parsed.get("services", []):
        if service.get("status") == "ACTIVE":
            service["runningCount"] = service["desiredCount"]


FARGATE = ("after-call.ecs.DescribeServices", fargate_runs_what_is_wanted)


def _deploy_network(templates: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """The app's VPC, subnets and security groups in moto (ECS checks them), by logical id."""
    ec2 = boto3.client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    known: dict[str, dict[str, dict[str, Any]]] = {}
    for stack, template in templates.items():
        for logical_id, resource in template["Resources"].items():
            if resource["Type"] == "AWS::EC2::Subnet":
                index = sum(len(found) for found in known.values())
                subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{index}.0/24")["Subnet"][
                    "SubnetId"
                ]
                known.setdefault(stack, {})[logical_id] = {"Ref": subnet, "SubnetId": subnet}
            elif resource["Type"] == "AWS::EC2::SecurityGroup":
                group = ec2.create_security_group(
                    GroupName=logical_id, Description="proof", VpcId=vpc
                )["GroupId"]
                known.setdefault(stack, {})[logical_id] = {"Ref": group, "GroupId": group}
    return known


@contextlib.contextmanager
def deployed_world(app: Synthesized, monkeypatch: Any) -> Iterator[World]:
    for key, value in {**HARNESS_KEYS, "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION}.items():
        monkeypatch.setenv(key, value)
    recorder = Recorder()
    config = {"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}}
    with contextlib.ExitStack() as stack:
        kubernetes = stack.enter_context(
            FakeKubernetes(authenticate=eks_user(recorder, f"{app.config.name_prefix}-eks"))
        )
        stack.enter_context(mock_aws(config=config))
        deployment = Deployment(app.templates, known=_deploy_network(app.templates))
        dispatcher = stack.enter_context(in_process_lambdas())
        stack.enter_context(recorder.installed())
        stack.enter_context(every_client([FARGATE]))
        hyperpod = _deploy_compute(deployment)
        sagemaker = FakeSageMaker(name=hyperpod["name"], arn=hyperpod["arn"])
        sagemaker.groups, sagemaker.restricted = hyperpod["groups"], hyperpod["restricted"]
        stack.enter_context(sagemaker.installed())
        eks_name = next(
            str(deployment.resolve(s, r["Properties"]["Name"]))
            for s, _, r in deployment.resources("AWS::EKS::Cluster")
        )
        eks = FakeEks(cluster=eks_name, endpoint=kubernetes.endpoint, ca_data=kubernetes.ca_data)
        stack.enter_context(eks.installed())
        stack.enter_context(
            FakeServiceQuotas(
                defaults={TOTAL_INSTANCES: 30}, **{"ml.p5.48xlarge for cluster usage": 4}
            ).installed()
        )
        bedrock = stack.enter_context(FakeBedrock(polls=0).installed())
        hosting = stack.enter_context(
            FakeSageMakerHosting(
                polls=0, on_endpoint=lambda model: _load_model_data(recorder, model)
            ).installed()
        )
        managed_jobs = stack.enter_context(FakeManagedJobs().installed())
        harness = boto3.Session(
            aws_access_key_id="test", aws_secret_access_key="test", region_name=REGION
        )
        clients = {name: harness.client(name) for name in CLIENTS}
        launcher = _launcher_processes(
            stack.enter_context(tempfile.TemporaryDirectory()), kubernetes
        )
        answers: dict[str, dict[str, Any]] = {}
        answering = {
            module: functools.partial(
                compose, respond=lambda url, answer: answers.update({url: answer})
            )
            for module, compose in (
                ("lambdas.kubernetes.bootstrap", bootstrap.compose),
                ("lambdas.kubernetes.chart_install", chart_install.compose),
            )
        }
        _publish_forge_recipes(clients["s3"])
        _store_hub_tokens(harness.client("secretsmanager"), app)
        # The tracking server (the app has one): each call it serves recorded as its IAM action.
        mlflow = stack.enter_context(
            FakeMlflowServer(
                f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:mlflow-tracking-server/"
                f"{app.config.name_prefix}",
                secret_of=lambda key: SECRET if recorder.principal_of(key) else None,
                artifact_root="",
                on_call=lambda key, action, arn: recorder.record(
                    key, "sagemaker-mlflow", action, {"TrackingServerArn": arn}
                ),
            )
        )
        pipeline = deploy_pipeline(
            app.template("pipeline"),
            clients=clients,
            dispatcher=dispatcher,
            # The proxy answers at once (a step not yet done is polled for); MLflow is on loopback.
            overrides={"POLL_SECONDS": "0", "WAIT_SECONDS": "0", "MLFLOW_ENDPOINT": mlflow.url},
            imports=deployment.exports,
            credentials=recorder.credentials,
            keep_data_key=True,
            composers={"lambdas.launcher.handler": launcher.compose, **answering},
        )
        _deploy_compute_functions(deployment, dispatcher, recorder.credentials, answering)
        mlflow.artifact_root = f"s3://{pipeline.data_bucket}/mlflow"
        sqs = clients["sqs"]
        inbox = sqs.create_queue(QueueName="inbox")["QueueUrl"]
        inbox_arn = sqs.get_queue_attributes(QueueUrl=inbox, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        clients["sns"].subscribe(
            TopicArn=pipeline.environment["ALERT_TOPIC_ARN"], Protocol="sqs", Endpoint=inbox_arn,
            Attributes={"RawMessageDelivery": "true"},
        )  # fmt: skip
        yield World(
            app=app,
            deployment=deployment,
            recorder=recorder,
            pipeline=pipeline,
            harness=harness,
            clients=clients,
            kubernetes=kubernetes,
            sagemaker=sagemaker,
            eks=eks,
            bedrock=bedrock,
            hosting=hosting,
            managed_jobs=managed_jobs,
            directory=_directory(deployment),
            inbox=inbox,
            launcher=launcher.processes,
            mlflow=mlflow,
            cloudformation=answers,
        )


def _load_model_data(recorder: Recorder, model: dict[str, Any]) -> None:
    """What SageMaker does before an endpoint's container starts, with the model's execution
    role: download every object under its model data's S3 prefix."""
    s3 = recorder.session(model["ExecutionRoleArn"]).client("s3")
    uri = model["PrimaryContainer"]["ModelDataSource"]["S3DataSource"]["S3Uri"]
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()


@dataclass(frozen=True)
class Launcher:
    processes: FakeLauncherProcesses
    compose: Compose


def _launcher_processes(workdir: str, kubernetes: FakeKubernetes) -> Launcher:
    """The launcher function as its image runs it (its recipes collection, the link of its Forge
    folder into the working directory, the image's settings), with the HyperPod CLI and helm
    faked at their process boundary."""
    recipes = Path(workdir, "recipes")
    (recipes / "fine-tuning/nova").mkdir(parents=True)
    (recipes / "fine-tuning/nova/forge").symlink_to(Path(workdir, "work/forge"))
    (recipes / "evaluation/nova").mkdir(parents=True)
    (recipes / "evaluation/nova/forge").symlink_to(Path(workdir, "work/forge-evaluation"))
    processes = FakeLauncherProcesses(recipes, kubernetes=kubernetes)
    image = {"HYPERPOD_RECIPES": str(recipes), "NEMO_LAUNCHER_SCRIPTS": "/opt/nemo",
             "LAUNCHER_WORKDIR": str(Path(workdir, "work")),
             "HYPERPOD_CONTEXT_FILE": str(Path(workdir, "hyperpod_current_context.json"))}  # fmt: skip

    def compose(environment: Mapping[str, str], clients: Clients) -> dict[str, Handler]:
        return compose_launcher({**environment, **image}, clients, run=processes)

    return Launcher(processes, compose)


def _store_hub_tokens(secrets: Any, app: Synthesized) -> None:
    """The operator's part before a gated model trains: its Hugging Face token in the secret
    the deployment's preset names."""
    names = {preset.hub_token_secret for preset in app.config.model_presets.values()}
    for name in sorted(names - {None}):
        secrets.create_secret(Name=name, SecretString=HUB_TOKEN)


def _publish_forge_recipes(s3: Any) -> None:
    """The Forge BYOO recipes, training and evaluation, where a Forge subscription reads them
    (stand-ins' leaves)."""
    published = {path: forge_recipe(recipe) for recipe, path in FORGE_RECIPES.items()}
    published[FORGE_EVALUATION_RECIPE] = forge_evaluation_recipe()
    for path, recipe in published.items():
        bucket, _, key = (
            FORGE_RECIPE_SOURCE.format(recipe=path).removeprefix("s3://").partition("/")
        )
        if bucket not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
            s3.create_bucket(Bucket=bucket)
        s3.put_object(Bucket=bucket, Key=key, Body=yaml.safe_dump(recipe).encode())


def dataset(records: int = 3) -> bytes:
    return b"".join(
        json.dumps({"id": f"w{i}", "metadata": {"prompt": "Play.", "answer": "crane"}}).encode()
        + b"\n"
        for i in range(records)
    )


EVALUATION_JOB = re.compile(r"-eval-[bf]-[a-z0-9]{5}$")  # domain/nova_job.py run_name


class JobController:
    """The training operator and kubelet, scripted: HyperPod's GPU nodes (of the standard and
    the restricted group) join as SageMaker runs them; a run's job — ours in its namespace (the
    trainer, or an evaluation), or the PyTorchJob AWS's chart puts in kubeflow — runs once read,
    then completes — or, as
    `outcome` says, its pod cannot pull its image ("bad_image"), or the training job keeps
    running ("hold": evaluations still complete)."""

    def __init__(
        self,
        api: FakeKubernetes,
        sagemaker: FakeSageMaker,
        groups: tuple[str, ...] = ("gpu", "nova"),
    ) -> None:
        self.api, self.sagemaker, self.groups = api, sagemaker, groups
        self.outcome = "complete"
        self.on_running: Callable[[str], None] = lambda namespace: None  # the trainer at work
        # The trainer image evaluating a stage (open-weights runs).
        self.on_evaluating: Callable[[str, EvaluationStage], None] = lambda namespace, stage: None
        self.on_nova_running: Callable[[str], None] = lambda job: None  # the Nova job at work
        self._reads: dict[str, int] = {}

    def _nodes(self) -> None:
        self.api.objects["/api/v1/nodes"] = {
            f"{g['InstanceGroupName']}-{i}": {
                "metadata": {"name": f"{g['InstanceGroupName']}-{i}", "labels": {
                    "node.kubernetes.io/instance-type": g["InstanceType"],
                    "sagemaker.amazonaws.com/node-health-status": "Schedulable"}},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            }
            for g in self.sagemaker.groups + self.sagemaker.restricted
            if g["InstanceGroupName"] in self.groups
            for i in range(g["TargetCount"])
        }  # fmt: skip

    def _read(self, key: str) -> tuple[str, bool]:
        """The job's condition at this read, and whether this is its first."""
        reads = self._reads[key] = self._reads.get(key, 0) + 1
        done = self.outcome == "complete" and reads > 1
        return ("Succeeded" if done else "Running"), reads == 1

    def __call__(self, method: str, path: str) -> None:
        if path == "/api/v1/nodes":
            self._nodes()
        if method == "GET" and path == PYTORCH_JOBS:
            self._nova_jobs()
        if method != "GET" or "jobs/" not in path:
            return
        collection, name = path.rsplit("/", 1)
        items = self.api.objects.get(collection, {})
        if name not in items or not (name == "trainer" or name.startswith("evaluation-")):
            return
        state, first = self._read(path)
        if name != "trainer" and self.outcome == "hold":
            state = "Succeeded" if self._reads[path] > 1 else state  # only training holds
        namespace = collection.split("/namespaces/")[1].split("/")[0]
        if first and self.outcome != "bad_image":
            if name == "trainer":
                self.on_running(namespace)
            else:
                self.on_evaluating(namespace, EvaluationStage(name.removeprefix("evaluation-")))
        state = "Completed" if state == "Succeeded" else state  # HyperPod's word for it
        items[name]["status"] = {"conditions": [{"type": state, "status": "True"}]}
        if self.outcome == "bad_image":
            pods = collection.replace("/apis/sagemaker.amazonaws.com/v1", "/api/v1").replace(
                "/hyperpodpytorchjobs", "/pods"
            )
            pod = _pulling(f"{name}-0")
            pod["metadata"]["labels"] = {"app.kubernetes.io/component": name}
            self.api.objects.setdefault(pods, {})[f"{name}-0"] = pod

    def _nova_jobs(self) -> None:
        for name, job in list(self.api.objects.get(PYTORCH_JOBS, {}).items()):
            state, first = self._read(name)
            if EVALUATION_JOB.search(name) and self.outcome == "hold":
                state = "Succeeded" if self._reads[name] > 1 else state  # only training holds
            if first and self.outcome != "bad_image":
                self.on_nova_running(name)
            job["status"] = {"conditions": [{"type": state, "status": "True"}]}
            if self.outcome == "bad_image":
                self.api.objects.setdefault(PODS, {})[f"{name}-master-0"] = _pulling(
                    f"{name}-master-0"
                )


def _pulling(pod: str) -> dict[str, Any]:
    return {
        "metadata": {"name": pod},
        "status": {"containerStatuses": [{
            "name": "pytorch", "image": "trainer:missing",
            "state": {"waiting": {"reason": "ErrImagePull", "message": "not found"}},
        }]},
    }  # fmt: skip


def role_of(deployment: Deployment, stack_suffix: str, logical_prefix: str) -> str:
    """The ARN of the one role of stack `<prefix>-<stack_suffix>` whose logical id starts so."""
    (arn,) = [
        role.arn
        for role in deployment.roles.values()
        if role.stack.endswith(f"-{stack_suffix}") and role.logical_id.startswith(logical_prefix)
    ]
    return arn


GUESSES = ["[slate]", "[moist]", "[crane]"]  # the secret is CRANE: three turns


@contextlib.contextmanager
def router_of_run(world: World, run_id: str, worker_key: str) -> Iterator[RouterClient]:
    """The run's router as its reward workers reach it: the proxy's function URL, SigV4-signed
    with the workers' key, the run's token from its parameter (what ECS hands the workers, with
    the execution role)."""
    prefix = world.app.config.name_prefix
    token = world.harness.client("ssm").get_parameter(
        Name=f"/{prefix}/runs/{run_id}/token", WithDecryption=True
    )["Parameter"]["Value"]
    proxy = world.function(PROXY_HANDLER)
    proxy_arn = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{proxy}"

    def function_url(event: dict[str, Any], _: Any) -> dict[str, Any]:
        key = event["requestContext"]["authorizer"]["iam"]["accessKey"]
        world.recorder.record(key, "lambda", "InvokeFunctionUrl", {"FunctionName": proxy_arn})
        return world.pipeline.dispatcher.call(proxy, event)

    with FunctionUrlServer(function_url) as url:
        yield RouterClient(
            url.url, run_id=run_id, run_token=token, region=REGION,
            credentials=lambda: Credentials(worker_key, SECRET),
        )  # fmt: skip


def exchange_rollouts(
    world: World,
    run_id: str,
    dataset_key: str,
    rollouts: int = 2,
    *,
    nova: bool = False,
    stage: EvaluationStage | None = None,
) -> dict[str, Any]:
    """A run's planes at work, each as its own role: the trainer (the job role of the run's
    pods; for a Nova run, the restricted group's execution role, a Nova job's only identity)
    reads its dataset, asks for rollouts (for `stage`'s evaluation: through that alias),
    answers generate requests and writes metrics;
    a reward worker (the fleet's task role) plays them through the proxy's function URL (SigV4);
    the router's consumer records the answers (Lambda, through the run's event source mapping)."""
    prefix = world.app.config.name_prefix
    deployment, recorder = world.deployment, world.recorder
    trainer_role = (
        role_of(deployment, "compute", "HyperPodRestrictedExecutionRole")
        if nova
        else role_of(deployment, "pipeline", "TrainingClusterControlJobRole")
    )
    trainer_session = recorder.session(trainer_role)
    worker_role = role_of(deployment, "compute", "RewardFleetTaskRole")
    worker_key = recorder.access_key(worker_role)
    worker_session = recorder.session(worker_role)
    queues = {
        kind: world.clients["sqs"].get_queue_url(QueueName=queue_name(prefix, run_id, kind))[
            "QueueUrl"
        ]
        for kind in QueueKind
    }
    bucket = world.pipeline.data_bucket
    s3, sqs = trainer_session.client("s3"), trainer_session.client("sqs")
    s3.get_object(Bucket=bucket, Key=dataset_key)["Body"].read()
    if stage is None:  # one the worker cannot read: to the dead-letter queue, not a rollout
        sqs.send_message(
            QueueUrl=queues[QueueKind.ROLLOUT_REQUESTS], MessageBody="{not a rollout request",
            MessageGroupId="poison", MessageDeduplicationId="poison",
        )  # fmt: skip
    # An evaluation's samples are numbered apart from training's (AWS's ids are AWS's).
    number = 0 if stage is None else 1 + list(EvaluationStage).index(stage)
    # A Nova job asks for its first rollout as Nova's trainer asks: it invokes the deployment's
    # rollout Lambda, unqualified, with its own role (the forwarder runs with its own); the
    # others go straight on the queue, as the open-weights trainer puts all of them.
    forwarder = world.function(FORWARDER_HANDLER)
    for index in range(rollouts):
        request = RolloutRequest(sample_id=f"w{index}_{number}", data={"answer": "crane"})
        if index == 0 and nova:
            recorder.record(
                recorder.access_key(trainer_role), "lambda", "Invoke", {"FunctionName": forwarder}
            )
            world.pipeline.dispatcher.call(forwarder, dump(request))
            continue
        sqs.send_message(
            QueueUrl=queues[QueueKind.ROLLOUT_REQUESTS], MessageBody=dump(request),
            MessageGroupId=request.sample_id, MessageDeduplicationId=request.sample_id,
        )  # fmt: skip
    start, finish = (
        _scripted_nova_trainer(sqs, queues) if nova else _open_weights_trainer(world, run_id, sqs)
    )
    with router_of_run(world, run_id, worker_key) as client:
        start()
        settings = WorkerSettings(
            rollout_request_queue_url=queues[QueueKind.ROLLOUT_REQUESTS],
            dead_letter_queue_url=queues[QueueKind.DLQ],
            wait_seconds=0,
            rollout_timeout_seconds=60,
        )
        reporting = RouterRolloutQueues(
            worker_session.client("sqs"), client,
            requests_url=queues[QueueKind.ROLLOUT_REQUESTS], dead_letter_url=queues[QueueKind.DLQ],
        )  # fmt: skip
        # Every rollout it answers kept in the run's trajectory store, with the worker's role.
        store = TrajectoryStore(
            s3_put(worker_session.client("s3"), bucket), prefix=trajectories_prefix(run_id)
        )
        worker = RewardWorker(
            queues=reporting,
            environment=load_environment(),
            model=client,
            settings=settings.model_copy(update={"run_id": run_id}),
            trajectories=store,
        )
        stats = worker.run(exit_when_idle=True)
        turns = finish()
    answered = sqs.receive_message(
        QueueUrl=queues[QueueKind.ROLLOUT_RESPONSES], MaxNumberOfMessages=10
    ).get("Messages", [])
    for message in answered:
        sqs.delete_message(
            QueueUrl=queues[QueueKind.ROLLOUT_RESPONSES], ReceiptHandle=message["ReceiptHandle"]
        )
    dead = world.clients["sqs"].receive_message(
        QueueUrl=queues[QueueKind.DLQ], MaxNumberOfMessages=10
    )
    return {
        "completed": stats.completed,
        "trajectories": store.stats.written,
        "responses": len(answered),
        "turns": turns,
        "dead-lettered": len(dead.get("Messages", [])),
    }


def _scripted_nova_trainer(
    sqs: Any, queues: dict[QueueKind, str]
) -> tuple[Callable[[], None], Callable[[], int]]:
    """AWS's Nova trainer (not ours): each turn answered with the guess of its turn."""
    trainer = ScriptedTrainer(
        sqs,
        requests_url=queues[QueueKind.GENERATE_REQUESTS],
        responses_url=queues[QueueKind.GENERATE_RESPONSES],
        reply=lambda request: GUESSES[sum(1 for m in request.messages if m.role == "assistant")],
    )

    def finish() -> int:
        trainer.stop.set()
        trainer.join(timeout=10)
        return trainer.answered

    return trainer.start, finish


class GuessingModel:
    """A generator (llm_trainer/generation.py) whose model writes the guess of its turn: the
    tiny tokenizer's tokens of it and the end of turn."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.lock = tokenizer, threading.Lock()

    def generate(
        self, prompts: Any, settings: Any, *, seed: int, stop: Any = None
    ) -> list[Sampled]:
        answers = []
        for prompt in prompts:
            turn = self.tokenizer.decode(prompt).count("<|im_start|>assistant") - 1
            ids = [*self.tokenizer.encode(GUESSES[turn], add_special_tokens=False),
                   self.tokenizer.eos_token_id]  # fmt: skip
            answers.append(Sampled(ids, [-1.0] * len(ids), "stop"))
        return answers

    def sync(self, model: Any) -> None:
        """No weights."""


def _open_weights_trainer(
    world: World, run_id: str, sqs: Any
) -> tuple[Callable[[], None], Callable[[], int]]:
    """The open-weights trainer's own generation service (llm_trainer/service.py) as the run's
    pods' role, on the job the run's settings say: its requests to SQS are the trainer's."""
    namespace = run_namespace(world.app.config.name_prefix, run_id)
    settings = world.kubernetes.objects[f"/api/v1/namespaces/{namespace}/configmaps"][SETTINGS]
    tokenizer = tiny_tokenizer()
    service = GenerationService(
        job_from_environment(settings["data"]), sqs=sqs, tokenizer=tokenizer,
        generator=GuessingModel(tokenizer),
    )  # fmt: skip

    def finish() -> int:
        service.stop()
        return service.counters.answered

    return service.start, finish


def write_metrics_as_the_trainer(world: World, namespace: str) -> None:
    """The trainer, with its pods' role, records its first steps where its job says (the run's
    settings in its namespace): what the monitor reads to tell a stalled job from a slow one,
    and its run's health from (an environment error in each step's eight rollouts: the default
    warning, which Monitor keeps on the run's record and alerts)."""
    settings = world.kubernetes.objects[f"/api/v1/namespaces/{namespace}/configmaps"][
        "run-settings"
    ]
    job = job_from_environment(settings["data"])
    pods = world.recorder.session(
        role_of(world.deployment, "pipeline", "TrainingClusterControlJobRole")
    )
    # First, for a gated model, its Hub token from the secret its preset names (__main__.py).
    if job.hub_token_secret is not None:
        assert hub_token(job.hub_token_secret, pods.client("secretsmanager")) == HUB_TOKEN
    trainer = pods.client("s3")
    # What llm_trainer does before its first step: find its own checkpoints (a restarted job
    # resumes from them) and the metrics lines up to them, read its training records.
    store = CheckpointStore(
        trainer, bucket=job.bucket, output_prefix=job.output_prefix, model=job.config.model,
        base_model=job.model_source,
    )  # fmt: skip
    assert store.latest() is None
    assert metrics_lines_of(trainer, bucket=job.bucket, output_prefix=job.output_prefix) == []
    assert training_records_of(trainer, job)
    trainer.put_object(
        Bucket=job.bucket, Key=f"{job.output_prefix}{METRICS_OBJECT}",
        Body=b"".join(
            json.dumps({"step": step, "mean_reward": 0.4, "zero_variance_groups": 0.0,
                        "rollouts": 7, "rollouts_asked": 8, "failed_rollouts": 1,
                        "env_error_rollouts": 1, "timeout_rollouts": 0}).encode() + b"\n"
            for step in (1, 2, 3)
        ),
    )  # fmt: skip
    # ... a checkpoint a step (the one before deleted: it keeps one), and at the end its final
    # checkpoint; each a folder, the trainer's state beside it, listed in the manifest.
    with tempfile.TemporaryDirectory() as scratch:
        folder, state = Path(scratch) / "adapter", Path(scratch) / "state.pt"
        folder.mkdir()
        (folder / "adapter_config.json").write_text("{}")
        state.write_bytes(b"optimizer")
        for step in (1, 2, 3):
            store.save(folder, name=step_checkpoint_name(step), step=step, mean_reward=0.4,
                       state=state, keep=1)  # fmt: skip
        store.save(folder, name=FINAL, step=3, mean_reward=0.4, state=state, keep=1)
    assert [saved.name for saved in store.manifest.checkpoints] == [
        step_checkpoint_name(3), FINAL,
    ]  # fmt: skip


def write_episodes_as_the_evaluator(world: World, namespace: str, stage: EvaluationStage) -> None:
    """The trainer image evaluating `stage`, with its pods' role, records its episodes where its
    job says (the evaluation's settings in the run's namespace): two held-out rollouts, the
    final better than the baseline."""
    settings = world.kubernetes.objects[f"/api/v1/namespaces/{namespace}/configmaps"][
        f"evaluation-{stage}-settings"
    ]
    job = job_from_environment(settings["data"])
    assert job.evaluation is stage
    evaluator = world.recorder.session(
        role_of(world.deployment, "pipeline", "TrainingClusterControlJobRole")
    )
    # What llm_trainer's evaluator reads: the held-out records, and for the final stage the
    # run's final checkpoint, found in its manifest and downloaded.
    assert evaluation_records_of(evaluator.client("s3"), job)
    if stage is EvaluationStage.FINAL:
        store = CheckpointStore(
            evaluator.client("s3"), bucket=job.bucket, output_prefix=job.output_prefix,
            model=job.config.model,
        )  # fmt: skip
        (final,) = [saved for saved in store.manifest.checkpoints if saved.name == FINAL]
        with tempfile.TemporaryDirectory() as scratch:
            download_folder(evaluator.client("s3"), store.uri(final), Path(scratch))
            assert (Path(scratch) / "adapter_config.json").is_file()
    reward = 0.2 if stage is EvaluationStage.BASELINE else 0.6
    episodes = [
        Episode.of(f"held-out-{i}", RolloutResponse(
            sample_id=f"eval-held-out-{i}_0", stop_reason="end_of_conversation",
            rewards={"aggregate_score": reward}, metrics=[Metric(name="turns", value=3)],
        ))
        for i in range(2)
    ]  # fmt: skip
    write_episodes(
        evaluator.client("s3"), bucket=job.bucket, output_prefix=job.output_prefix, stage=stage,
        episodes=episodes,
    )  # fmt: skip


def nova_recipe(world: World, job: str) -> dict[str, Any]:
    """The recipe AWS's launcher started Nova job `job` with."""
    (recipe,) = [
        r for r in world.launcher.recipes_read if re.match(job_pattern(r["run"]["name"]), job)
    ]
    return recipe


def write_manifest_as_the_nova_job(world: World, job: str) -> None:
    """The Nova job, with its only identity, records its checkpoints where HyperPod's Nova jobs
    do: `<output_s3_path>/<job>/manifest.json`, pointing at them with `checkpoint_s3_bucket`
    (what the Nova Forge SDK reads, util/checkpoint_util.py)."""
    output = urlsplit(nova_recipe(world, job)["run"]["output_s3_path"])
    nova = world.recorder.session(
        role_of(world.deployment, "compute", "HyperPodRestrictedExecutionRole")
    )
    nova.client("s3").put_object(
        Bucket=output.hostname, Key=f"{output.path.lstrip('/')}{job}/manifest.json",
        Body=json.dumps({"checkpoint_s3_bucket": f"s3://customer-escrow/{job}"}).encode(),
    )  # fmt: skip


def publish_stacks(world: World) -> None:
    """The stacks as CloudFormation shows them once deployed: their outputs, which `mtrl`
    reads to find everything."""
    cloudformation = world.harness.client("cloudformation")
    for stack, template in world.deployment.templates.items():
        outputs = {
            key: {"Value": str(world.deployment.resolve(stack, output["Value"]))}
            for key, output in template.get("Outputs", {}).items()
        }
        body = {
            "Resources": {
                "Marker": {
                    "Type": "AWS::SNS::Topic",
                    "Properties": {"TopicName": f"{stack}-marker"},
                }
            },
            "Outputs": outputs,
        }
        cloudformation.create_stack(StackName=stack, TemplateBody=json.dumps(body))


OPERATOR = "operator"  # the principal of the operator's managed policy


def run_cli(world: World, monkeypatch: Any, *args: str) -> Any:
    """`mtrl ARGS` as someone holding the operator's managed policy would run it."""
    from typer.testing import CliRunner

    from mtrl.cli import app

    with monkeypatch.context() as scoped:
        for key, value in world.recorder.credentials(OPERATOR).items():
            scoped.setenv(key, value)
        return CliRunner().invoke(app, [*args, "--region", REGION])


def custom_resource(world: World, resource_type: str, request_type: str) -> dict[str, Any]:
    """CloudFormation's call of the function behind the app's one custom resource of
    `resource_type`, with the properties synthesized for it, and the answer the function gave at
    the pre-signed response URL (CloudFormation's bucket, in the form its events carry)."""
    ((stack, logical_id, resource),) = world.deployment.resources(resource_type)
    properties = world.deployment.resolve(stack, resource["Properties"])
    function = properties.pop("ServiceToken")
    stack_id = f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{stack}/1"
    request_id = f"{request_type.lower()}-{len(world.cloudformation)}"
    response_url = (
        f"https://{RESPONSE_BUCKET.format(region=REGION.replace('-', ''))}.s3.amazonaws.com/"
        f"{quote(f'{stack_id}|{logical_id}|{request_id}', safe='')}"
        "?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Expires=7200&X-Amz-Signature=0"
    )
    event = {
        "RequestType": request_type,
        "ResponseURL": response_url,
        "StackId": stack_id,
        "RequestId": request_id,
        "LogicalResourceId": logical_id,
        "ResourceType": resource_type,
        "ResourceProperties": properties,
        **(
            {"PhysicalResourceId": world.physical_ids[logical_id]}
            if request_type != "Create"
            else {}
        ),
    }
    world.pipeline.dispatcher.call(function, event)
    answer = world.cloudformation[response_url]
    world.physical_ids[logical_id] = answer["PhysicalResourceId"]
    return answer


def managed_job_at_work(world: World, job: dict[str, Any], *, rollouts: int = 2) -> dict[str, Any]:
    """A serverless run's managed job once SageMaker starts it, each side as its own role: the
    job (the job role the pipeline passed) reads its train channel and invokes the agent Lambda
    its document names with the SDK's RolloutRequest for each of the first `rollouts` records
    (the agent puts each on the run's queue with its own role); the run's reward worker (the
    fleet's task role), in agent mode, plays them against the job's policy at its runtime
    service (mtrl/local/job_runtime.py's stand-in, answering each turn with that turn's guess)
    and reports them there, and to the run's router (its reward curve, an evaluation's
    episodes). A training job's or an evaluation job's alike (its one channel's records). The
    agent's answers and the trajectories as the runtime has them."""
    document = json.loads(job["JobConfigDocument"])
    session = world.recorder.session(job["RoleArn"])
    (channel,) = document["InputDataConfig"]  # train, or an evaluation's records
    location = urlsplit(channel["DataSource"]["S3DataSource"]["S3Uri"])
    records = (
        session.client("s3")
        .get_object(Bucket=location.netloc, Key=location.path.lstrip("/"))["Body"]
        .read()
        .splitlines()
    )
    agent = document["AgentConfig"]["CustomAgentLambdaConfig"]["LambdaArn"]
    (run_id,) = [tag["Value"] for tag in job["Tags"] if tag["Key"] == RUN_TAG]
    prefix = world.app.config.name_prefix
    queues = {
        kind: world.clients["sqs"].get_queue_url(QueueName=queue_name(prefix, run_id, kind))[
            "QueueUrl"
        ]
        for kind in (QueueKind.ROLLOUT_REQUESTS, QueueKind.DLQ)
    }
    worker_role = role_of(world.deployment, "compute", "RewardFleetTaskRole")
    worker_session = world.recorder.session(worker_role)

    def guess(_job: str, _trajectory: str, request: dict[str, Any]) -> dict[str, Any]:
        turn = sum(message["role"] == "assistant" for message in request["messages"])
        message = {"role": "assistant", "content": GUESSES[turn]}
        return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}

    with (
        JobRuntimeStandIn(guess, region=REGION) as runtime,
        router_of_run(world, run_id, world.recorder.access_key(worker_role)) as router,
    ):
        runtime.open_job(job["JobArn"])
        answers = {}
        for line in records[:rollouts]:
            trajectory = runtime.new_trajectory(job["JobArn"])
            request = AgentRolloutRequest(
                instance=json.loads(line),
                metadata=RolloutMetadata(
                    job_arn=job["JobArn"], trajectory_id=trajectory, region=REGION,
                    endpoint=runtime_endpoint(REGION),
                ),
            )  # fmt: skip
            world.recorder.record(
                world.recorder.access_key(job["RoleArn"]), "lambda", "Invoke",
                {"FunctionName": agent},
            )  # fmt: skip
            answers[trajectory] = world.pipeline.dispatcher.call(
                agent, request.model_dump(mode="json")
            )
        mode = AgentMode(job_runtime_clients(runtime.url, session=worker_session), max_length=4096)
        store = TrajectoryStore(
            s3_put(worker_session.client("s3"), world.pipeline.data_bucket),
            prefix=trajectories_prefix(run_id),
        )
        worker = RewardWorker(
            queues=mode.queues(
                worker_session.client("sqs"), requests_url=queues[QueueKind.ROLLOUT_REQUESTS],
                dead_letter_url=queues[QueueKind.DLQ], router=router,
            ),
            environment=load_environment(), model=mode.model, read=mode.read,
            settings=WorkerSettings(
                rollout_request_queue_url=queues[QueueKind.ROLLOUT_REQUESTS], run_id=run_id,
                wait_seconds=0, rollout_timeout_seconds=60,
            ),
            trajectories=store,
        )  # fmt: skip
        stats = worker.run(exit_when_idle=True)
        worker.close()
        played = {t: runtime.trajectory(job["JobArn"], t) for t in answers}
    return {
        "agent": answers,
        "completed": stats.completed,
        "kept": store.stats.written,
        "trajectories": {t: (p.status, p.rewards, len(p.turns)) for t, p in played.items()},
    }
