"""AWS APIs that moto lacks (HyperPod's UpdateCluster, EKS Pod Identity, an EKS endpoint of
our choosing), answered by Python behind real botocore clients.

The code under test holds an ordinary boto3 client: botocore validates each request against the
service's model as it would for AWS; every answer is checked against the operation's output
shape (and every error code against the operation's modelled errors), then sent back on the wire
as the service's JSON protocol would and parsed by botocore — so a fake can only answer what the
real API could. Operations a fake does not define go on to moto as usual.
"""

from __future__ import annotations

import copy
import datetime
import io
import itertools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import boto3
import botocore.handlers
from botocore import xform_name
from botocore.awsrequest import AWSResponse
from botocore.validate import ParamValidator

from mtrl.local.managed_job import public_hub_model

REGION, ACCOUNT = "us-east-1", "123456789012"
# Errors any operation may answer (the common errors of every AWS API).
COMMON_ERRORS = {"AccessDeniedException", "ThrottlingException", "ValidationException"}


@contextmanager
def every_client(handlers: list[tuple[str, Any]]) -> Iterator[None]:
    """botocore event `handlers` on every client made meanwhile, in any session (the default
    one is made anew so that its clients have them too)."""
    botocore.handlers.BUILTIN_HANDLERS.extend(handlers)
    boto3.DEFAULT_SESSION = None
    try:
        yield
    finally:
        for handler in handlers:
            botocore.handlers.BUILTIN_HANDLERS.remove(handler)
        boto3.DEFAULT_SESSION = None


class AwsError(Exception):
    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.status = code, message, status


class _Raw:
    """The body as urllib3 hands it to botocore: streamed, or read (a streaming payload)."""

    def __init__(self, body: bytes) -> None:
        self._body = io.BytesIO(body)

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body.read()

    def read(self, amount: int | None = None, **_: Any) -> bytes:
        return self._body.read(amount)


def _wire(value: Any) -> Any:
    """JSON protocols send timestamps as epoch seconds."""
    if isinstance(value, datetime.datetime):
        return value.timestamp()
    raise TypeError(f"cannot send {value!r}")


class ServiceFake:
    """Operations answered by this object's snake_case methods (keyword arguments = the API's
    parameters); `requests` holds (operation, parameters) in order."""

    service: ClassVar[str]

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        model = boto3.client(self.service, region_name=REGION).meta.service_model
        self._service_id = model.service_id.hyphenize()

    def client(self, **kwargs: Any) -> Any:
        """A client of this API (and moto, for what the fake does not answer)."""
        client = boto3.client(self.service, region_name=REGION, **kwargs)
        for event, handler in self._handlers():
            client.meta.events.register(event, handler)
        return client

    @contextmanager
    def installed(self) -> Iterator[ServiceFake]:
        """Every client made meanwhile, anywhere in the process, reaches this fake."""
        with every_client(self._handlers()):
            yield self

    def operations(self, name: str) -> list[dict[str, Any]]:
        return [params for operation, params in self.requests if operation == name]

    def _handlers(self) -> list[tuple[str, Any]]:
        return [
            (f"before-parameter-build.{self._service_id}", self._keep_request),
            (f"before-send.{self._service_id}", self._answer),
        ]

    @staticmethod
    def _keep_request(
        params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any
    ) -> None:
        context["fake_request"] = (model, copy.deepcopy(params))

    def _answer(self, request: Any, **_: Any) -> Any:
        model, params = request.context["fake_request"]
        method = getattr(self, xform_name(model.name), None)
        if method is None:
            return None
        self.requests.append((model.name, copy.deepcopy(params)))
        url = request.url
        # Every before-send handler runs; moto's (when mocking) would answer this request too,
        # so it leaves for a host no AWS API lives at once this answer is made.
        request.url = "https://answered-by-a-fake.invalid/"
        headers = {"Content-Type": "application/x-amz-json-1.1", "x-amzn-RequestId": "fake"}
        try:
            answer = method(**params)
        except AwsError as error:
            known = {shape.name for shape in model.error_shapes} | COMMON_ERRORS
            assert error.code in known, f"{model.name} cannot answer {error.code} (known: {known})"
            body = json.dumps({"__type": error.code, "message": error.message}).encode()
            return AWSResponse(url, error.status, headers, _Raw(body))
        if model.output_shape is None:  # the operation answers nothing but its status
            assert answer == {}, f"{model.name} answers nothing, not {answer}"
            return _response(url, answer, None, headers)
        report = ParamValidator().validate(answer, model.output_shape)
        assert not report.has_errors(), (
            f"the {self.service} fake answered {model.name} with what the API cannot: "
            f"{report.generate_report()}"
        )
        return _response(url, answer, model.output_shape, headers)


def _response(url: str, answer: dict[str, Any], shape: Any, headers: dict[str, str]) -> AWSResponse:
    """`answer` on the wire as the operation's REST or JSON protocol puts it: members bound to
    headers or the status code there, a payload member as the body, the rest as a JSON body."""
    status, body = 200, {}
    payload = shape.serialization.get("payload") if shape is not None else None
    for name, value in answer.items():
        member = shape.members[name]
        location = member.serialization.get("location")
        if location == "statusCode":
            status = int(value)
        elif location == "header":
            headers[member.serialization.get("name", name)] = str(value)
        elif name != payload:
            body[name] = value
    if payload is not None:
        raw = answer.get(payload, b"")
        return AWSResponse(
            url,
            status,
            headers,
            _Raw(raw if isinstance(raw, bytes) else json.dumps(raw, default=_wire).encode()),
        )
    return AWSResponse(url, status, headers, _Raw(json.dumps(body, default=_wire).encode()))


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


# Two groups as DescribeCluster shows them: the system group, and a GPU group at zero with
# Kubernetes labels and taints, flexible instance types and auto-patching (members whose names
# and shapes differ between DescribeCluster and UpdateCluster).
GROUPS = [
    {
        "InstanceGroupName": "system", "InstanceType": "ml.m5.2xlarge", "CurrentCount": 1,
        "TargetCount": 1, "Status": "InService", "ExecutionRole": f"arn:aws:iam::{ACCOUNT}:role/hp",
        "LifeCycleConfig": {"SourceS3Uri": "s3://sagemaker-lc/", "OnCreate": "on_create.sh"},
        "ThreadsPerCore": 1, "CurrentImageId": "ami-0123456789abcdef0", "DesiredImageId": "ami-0123456789abcdef0",
    },
    {
        "InstanceGroupName": "gpu", "InstanceType": "ml.p5.48xlarge", "CurrentCount": 0,
        "TargetCount": 0, "Status": "InService", "ExecutionRole": f"arn:aws:iam::{ACCOUNT}:role/hp",
        "LifeCycleConfig": {"SourceS3Uri": "s3://sagemaker-lc/", "OnCreate": "on_create.sh"},
        "ThreadsPerCore": 1, "OnStartDeepHealthChecks": ["InstanceStress"],
        "KubernetesConfig": {
            "CurrentLabels": {"team": "rl"}, "DesiredLabels": {"team": "rl", "tier": "gpu"},
            "CurrentTaints": [{"Key": "gpu", "Value": "true", "Effect": "NoSchedule"}],
            "DesiredTaints": [{"Key": "gpu", "Value": "true", "Effect": "NoSchedule"}],
        },
        "InstanceRequirements": {
            "CurrentInstanceTypes": ["ml.p5.48xlarge"], "DesiredInstanceTypes": ["ml.p5.48xlarge"],
        },
        "AutoPatchConfig": {"PatchingStrategy": "ROLLING"},
    },
]  # fmt: skip
# A Nova restricted instance group as DescribeCluster shows one (botocore's
# ClusterRestrictedInstanceGroupDetails): its FSx for Lustre, no lifecycle scripts.
RESTRICTED_GROUPS = [
    {
        "InstanceGroupName": "nova", "InstanceType": "ml.p5.48xlarge", "CurrentCount": 0,
        "TargetCount": 0, "Status": "InService",
        "ExecutionRole": f"arn:aws:iam::{ACCOUNT}:role/nova-rig", "ThreadsPerCore": 1,
        "EnvironmentConfig": {
            "FSxLustreConfig": {"SizeInGiB": 1200, "PerUnitStorageThroughput": 250},
            "S3OutputPath": "s3://nova-rig-output/",
        },
    },
]  # fmt: skip


class FakeSageMaker(ServiceFake):
    """One HyperPod cluster: DescribeCluster, UpdateCluster (counts), ListClusterNodes; its
    standard groups and its restricted ones."""

    service = "sagemaker"

    def __init__(self, *, name: str = "nova-mtrl", arn: str | None = None) -> None:
        super().__init__()
        self.name = name
        self.arn = arn or f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:cluster/0a1b2c3d4e5f"
        self.groups = copy.deepcopy(GROUPS)
        self.restricted = copy.deepcopy(RESTRICTED_GROUPS)
        self.updates: list[dict[str, Any]] = []

    def _known(self, name: str) -> None:
        if name not in (self.name, self.arn):
            raise AwsError("ResourceNotFound", f"Cluster {name} not found")

    def describe_cluster(self, ClusterName: str) -> dict[str, Any]:  # noqa: N803
        self._known(ClusterName)
        return {
            "ClusterArn": self.arn,
            "ClusterName": self.name,
            "ClusterStatus": "InService",
            "CreationTime": _now(),
            "InstanceGroups": copy.deepcopy(self.groups),
            **(
                {"RestrictedInstanceGroups": copy.deepcopy(self.restricted)}
                if self.restricted
                else {}
            ),
        }

    def update_cluster(self, ClusterName: str, **request: Any) -> dict[str, Any]:  # noqa: N803
        self._known(ClusterName)
        self.updates.append(copy.deepcopy(request))
        for member, groups in (
            ("InstanceGroups", self.groups),
            ("RestrictedInstanceGroups", self.restricted),
        ):
            for spec in request.get(member, []):
                for group in groups:
                    if group["InstanceGroupName"] == spec["InstanceGroupName"]:
                        group["TargetCount"] = spec["InstanceCount"]
        return {"ClusterArn": self.arn}

    def list_cluster_nodes(
        self,
        ClusterName: str,
        InstanceGroupNameContains: str = "",
        **_: Any,  # noqa: N803
    ) -> dict[str, Any]:
        """Nodes of the groups whose name contains `InstanceGroupNameContains` (a substring
        filter, as botocore's model documents it), the GPU group's with one still pending."""
        self._known(ClusterName)
        nodes = [
            {"InstanceGroupName": g["InstanceGroupName"], "InstanceId": f"i-{g['InstanceGroupName']}{n:012d}",
             "InstanceType": g["InstanceType"], "LaunchTime": _now(), "InstanceStatus": {"Status": "Running"}}
            for g in self.groups + self.restricted for n in range(g["TargetCount"])
        ] + [{"InstanceGroupName": "gpu", "InstanceId": "i-gpupending000", "InstanceType": "ml.p5.48xlarge",
              "LaunchTime": _now(), "InstanceStatus": {"Status": "Pending"}}]  # fmt: skip
        return {
            "ClusterNodeSummaries": [
                node for node in nodes if InstanceGroupNameContains in node["InstanceGroupName"]
            ]
        }


class FakeEks(ServiceFake):
    """EKS Pod Identity associations (moto has none) and, with `endpoint`, DescribeCluster of
    one cluster whose Kubernetes API is served at that endpoint with that CA."""

    service = "eks"

    def __init__(
        self, *, cluster: str = "nova-mtrl-eks", endpoint: str | None = None, ca_data: str = ""
    ) -> None:
        super().__init__()
        self.cluster, self.endpoint, self.ca_data = cluster, endpoint, ca_data
        self.associations: dict[str, dict[str, Any]] = {}
        self._ids = itertools.count(1)
        if endpoint is None:
            self.describe_cluster = None  # type: ignore[assignment]  # moto answers

    def describe_cluster(self, name: str) -> dict[str, Any]:
        if name != self.cluster:
            raise AwsError("ResourceNotFoundException", f"No cluster found for name: {name}.", 404)
        return {
            "cluster": {
                "name": name,
                "arn": f"arn:aws:eks:{REGION}:{ACCOUNT}:cluster/{name}",
                "status": "ACTIVE",
                "version": "1.33",
                "endpoint": self.endpoint,
                "resourcesVpcConfig": {
                    "endpointPublicAccess": True,
                    "endpointPrivateAccess": True,
                },
                "certificateAuthority": {"data": self.ca_data},
                "accessConfig": {"authenticationMode": "API"},
            }
        }

    def create_pod_identity_association(self, **params: Any) -> dict[str, Any]:
        association_id = f"a-{next(self._ids):017d}"
        association = {
            "associationId": association_id,
            "associationArn": f"arn:aws:eks:{REGION}:{ACCOUNT}:podidentityassociation/{params['clusterName']}/{association_id}",
            **{
                key: params[key]
                for key in ("clusterName", "namespace", "serviceAccount", "roleArn")
            },
            "createdAt": _now(),
        }
        self.associations[association_id] = association
        return {"association": association}

    def delete_pod_identity_association(
        self, clusterName: str, associationId: str
    ) -> dict[str, Any]:  # noqa: N803
        if associationId not in self.associations:
            raise AwsError("ResourceNotFoundException", f"No association {associationId}", 404)
        return {"association": self.associations.pop(associationId)}

    def list_pod_identity_associations(self, clusterName: str, **params: Any) -> dict[str, Any]:  # noqa: N803
        found = [
            {k: a[k] for k in ("clusterName", "namespace", "serviceAccount", "associationArn", "associationId")}
            for a in self.associations.values()
            if a["clusterName"] == clusterName and a["namespace"] == params.get("namespace", a["namespace"])
        ]  # fmt: skip
        return {"associations": found}


class FakeServiceQuotas(ServiceFake):
    """The account's SageMaker quotas (moto has none): the applied values (ListServiceQuotas,
    only quotas raised for the account) and AWS's defaults (ListAWSDefaultServiceQuotas)."""

    service = "service-quotas"

    def __init__(self, defaults: dict[str, float] | None = None, **applied: float) -> None:
        super().__init__()
        self.values = applied
        self.defaults = defaults or {}

    @staticmethod
    def _quotas(service: str, values: dict[str, float]) -> dict[str, Any]:
        return {
            "Quotas": [
                {"ServiceCode": service, "QuotaName": name,
                 "QuotaCode": f"L-{sum(map(ord, name)):08X}", "Value": value}
                for name, value in values.items()
            ]
        }  # fmt: skip

    def list_service_quotas(self, ServiceCode: str, **_: Any) -> dict[str, Any]:  # noqa: N803
        return self._quotas(ServiceCode, self.values)

    def list_aws_default_service_quotas(self, ServiceCode: str, **_: Any) -> dict[str, Any]:  # noqa: N803
        return self._quotas(ServiceCode, self.defaults)


class FakeBedrock(ServiceFake):
    """Bedrock's custom models and their on-demand deployments, by name or ARN: each is Creating
    for `polls` Gets after it was made, then Active (a model made while `import_fails`: Failed)."""

    service = "bedrock"

    def __init__(
        self, *, polls: int = 2, import_fails: bool = False, failure: str | None = "bad checkpoint"
    ) -> None:
        """`failure`: the failed import's message (None: Bedrock gives none)."""
        super().__init__()
        self.polls, self.import_fails, self.failure = polls, import_fails, failure
        self.models: dict[str, dict[str, Any]] = {}  # by name
        self.deployments: dict[str, dict[str, Any]] = {}  # by name
        self._ids = (f"{n:012x}" for n in itertools.count(0xA00000000000))

    @staticmethod
    def _named(records: dict[str, dict[str, Any]], identifier: str, arn_key: str) -> dict[str, Any]:
        for name, record in records.items():
            if identifier in (name, record[arn_key]):
                return record
        raise AwsError("ResourceNotFoundException", f"{identifier} not found", 404)

    def _status(self, record: dict[str, Any], failed: bool = False) -> str:
        record["gets"] += 1
        if record["gets"] <= self.polls:
            return "Creating"
        return "Failed" if failed else "Active"

    def create_custom_model(self, modelName: str, **params: Any) -> dict[str, Any]:  # noqa: N803
        if modelName in self.models:
            raise AwsError("ConflictException", f"model {modelName} exists")
        arn = f"arn:aws:bedrock:{REGION}:{ACCOUNT}:custom-model/imported/{next(self._ids)}"
        self.models[modelName] = {
            "arn": arn, "params": params, "gets": 0, "made": _now(), "fails": self.import_fails,
        }  # fmt: skip
        return {"modelArn": arn}

    def get_custom_model(self, modelIdentifier: str) -> dict[str, Any]:  # noqa: N803
        record = self._named(self.models, modelIdentifier, "arn")
        name = next(n for n, r in self.models.items() if r is record)
        status = self._status(record, failed=record["fails"])
        # modelStatus is optional in GetCustomModel's answer: none is given while it is made.
        answer = {"modelArn": record["arn"], "modelName": name, "creationTime": record["made"]}
        if status != "Creating":
            answer["modelStatus"] = status
        if status == "Failed" and self.failure:
            answer["failureMessage"] = self.failure
        return answer

    def delete_custom_model(self, modelIdentifier: str) -> dict[str, Any]:  # noqa: N803
        record = self._named(self.models, modelIdentifier, "arn")
        self.models = {n: r for n, r in self.models.items() if r is not record}
        return {}

    def create_custom_model_deployment(
        self,
        modelDeploymentName: str,
        modelArn: str,
        **params: Any,  # noqa: N803
    ) -> dict[str, Any]:
        if modelDeploymentName in self.deployments:
            raise AwsError("ConflictException", f"deployment {modelDeploymentName} exists")
        arn = f"arn:aws:bedrock:{REGION}:{ACCOUNT}:custom-model-deployment/{next(self._ids)}"
        self.deployments[modelDeploymentName] = {
            "arn": arn, "model": modelArn, "params": params, "gets": 0, "made": _now(),
        }  # fmt: skip
        return {"customModelDeploymentArn": arn}

    def get_custom_model_deployment(
        self,
        customModelDeploymentIdentifier: str,  # noqa: N803
    ) -> dict[str, Any]:
        record = self._named(self.deployments, customModelDeploymentIdentifier, "arn")
        name = next(n for n, r in self.deployments.items() if r is record)
        return {
            "customModelDeploymentArn": record["arn"], "modelDeploymentName": name,
            "modelArn": record["model"], "createdAt": record["made"],
            "status": self._status(record),
        }  # fmt: skip

    def delete_custom_model_deployment(
        self,
        customModelDeploymentIdentifier: str,  # noqa: N803
    ) -> dict[str, Any]:
        record = self._named(self.deployments, customModelDeploymentIdentifier, "arn")
        self.deployments = {n: r for n, r in self.deployments.items() if r is not record}
        return {}


class FakeSageMakerHosting(ServiceFake):
    """SageMaker's real-time hosting: models, endpoint configs and endpoints, by name. An endpoint
    is Creating for `polls` describes after it was made, then InService (made while `fails`:
    Failed, with `failure` as its reason). A name not there is SageMaker's ValidationException
    "Could not find …". `on_endpoint(model)`: what SageMaker does with the model of an endpoint
    it makes (read its model data with its execution role)."""

    service = "sagemaker"

    def __init__(
        self,
        *,
        polls: int = 2,
        fails: bool = False,
        failure: str = "The primary container did not pass the ping health check",
        on_endpoint: Any = None,
    ) -> None:
        super().__init__()
        self.polls, self.fails, self.failure, self.on_endpoint = polls, fails, failure, on_endpoint
        self.models: dict[str, dict[str, Any]] = {}
        self.configs: dict[str, dict[str, Any]] = {}
        self.endpoints: dict[str, dict[str, Any]] = {}

    @staticmethod
    def _arn(kind: str, name: str) -> str:
        return f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:{kind}/{name.lower()}"

    @staticmethod
    def _get(records: dict[str, dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
        if name not in records:
            raise AwsError("ValidationException", f'Could not find {kind} "{name}".')
        return records[name]

    def create_model(self, ModelName: str, **params: Any) -> dict[str, Any]:  # noqa: N803
        if ModelName in self.models:
            raise AwsError(
                "ValidationException", f"Cannot create already existing model {ModelName}"
            )
        self.models[ModelName] = {**params, "made": _now()}
        return {"ModelArn": self._arn("model", ModelName)}

    def describe_model(self, ModelName: str) -> dict[str, Any]:  # noqa: N803
        model = self._get(self.models, "model", ModelName)
        return {
            "ModelName": ModelName, "ModelArn": self._arn("model", ModelName),
            "PrimaryContainer": model["PrimaryContainer"], "CreationTime": model["made"],
            "ExecutionRoleArn": model["ExecutionRoleArn"],
        }  # fmt: skip

    def delete_model(self, ModelName: str) -> dict[str, Any]:  # noqa: N803
        self._get(self.models, "model", ModelName)
        del self.models[ModelName]
        return {}

    def create_endpoint_config(self, EndpointConfigName: str, **params: Any) -> dict[str, Any]:  # noqa: N803
        if EndpointConfigName in self.configs:
            raise AwsError(
                "ValidationException",
                f"Cannot create already existing endpoint configuration {EndpointConfigName}",
            )
        for variant in params["ProductionVariants"]:
            self._get(self.models, "model", variant["ModelName"])
        self.configs[EndpointConfigName] = {**params, "made": _now()}
        return {"EndpointConfigArn": self._arn("endpoint-config", EndpointConfigName)}

    def describe_endpoint_config(self, EndpointConfigName: str) -> dict[str, Any]:  # noqa: N803
        config = self._get(self.configs, "endpoint configuration", EndpointConfigName)
        return {
            "EndpointConfigName": EndpointConfigName,
            "EndpointConfigArn": self._arn("endpoint-config", EndpointConfigName),
            "ProductionVariants": config["ProductionVariants"], "CreationTime": config["made"],
        }  # fmt: skip

    def delete_endpoint_config(self, EndpointConfigName: str) -> dict[str, Any]:  # noqa: N803
        self._get(self.configs, "endpoint configuration", EndpointConfigName)
        del self.configs[EndpointConfigName]
        return {}

    def create_endpoint(
        self,
        EndpointName: str,
        EndpointConfigName: str,
        **_: Any,  # noqa: N803
    ) -> dict[str, Any]:
        if EndpointName in self.endpoints:
            raise AwsError(
                "ValidationException", f"Cannot create already existing endpoint {EndpointName}"
            )
        config = self._get(self.configs, "endpoint configuration", EndpointConfigName)
        if self.on_endpoint is not None:
            for variant in config["ProductionVariants"]:
                self.on_endpoint(self.models[variant["ModelName"]])
        self.endpoints[EndpointName] = {
            "config": EndpointConfigName, "describes": 0, "fails": self.fails, "made": _now(),
        }  # fmt: skip
        return {"EndpointArn": self._arn("endpoint", EndpointName)}

    def describe_endpoint(self, EndpointName: str) -> dict[str, Any]:  # noqa: N803
        endpoint = self._get(self.endpoints, "endpoint", EndpointName)
        endpoint["describes"] += 1
        status = (
            "Creating" if endpoint["describes"] <= self.polls
            else "Failed" if endpoint["fails"] else "InService"
        )  # fmt: skip
        answer = {
            "EndpointName": EndpointName, "EndpointArn": self._arn("endpoint", EndpointName),
            "EndpointConfigName": endpoint["config"], "EndpointStatus": status,
            "CreationTime": endpoint["made"], "LastModifiedTime": endpoint["made"],
        }  # fmt: skip
        return answer | ({"FailureReason": self.failure} if status == "Failed" else {})

    def delete_endpoint(self, EndpointName: str) -> dict[str, Any]:  # noqa: N803
        self._get(self.endpoints, "endpoint", EndpointName)
        del self.endpoints[EndpointName]
        return {}


# What a fake training job reports AWS billed it (the shape the SDK's AgentRFTJob reads).
BILLED_TOKENS = {"TrainTokenCount": 48_000, "PrefillTokenCount": 36_000, "SampleTokenCount": 12_000}


class FakeManagedJobs(ServiceFake):
    """SageMaker's managed jobs (CreateJob, DescribeJob, StopJob; moto has none) and its public
    hub's models (DescribeHubContent). A job is InProgress until `finish` says how it ended;
    `on_created` sees each new job (its name and request) as the service would start it."""

    service = "sagemaker"

    def __init__(self) -> None:
        super().__init__()
        self.jobs: dict[str, dict[str, Any]] = {}
        self.on_created: Any = None

    def _job(self, name: str, category: str) -> dict[str, Any]:
        job = self.jobs.get(name)
        if job is None or job["JobCategory"] != category:
            raise AwsError("ResourceNotFound", f"Job {name} of category {category} not found")
        return job

    def create_job(self, JobName: str, JobCategory: str, **request: Any) -> dict[str, Any]:  # noqa: N803
        if JobName in self.jobs:
            raise AwsError("ResourceInUse", f"Job {JobName} already exists")
        now = _now()
        self.jobs[JobName] = {
            "JobName": JobName,
            "JobArn": f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:job/{JobCategory}/{JobName}",
            "JobCategory": JobCategory,
            "RoleArn": request["RoleArn"],
            "JobConfigSchemaVersion": request["JobConfigSchemaVersion"],
            "JobConfigDocument": request["JobConfigDocument"],
            "CreationTime": now,
            "LastModifiedTime": now,
            "JobStatus": "InProgress",
            "SecondaryStatus": "Training",
            "SecondaryStatusTransitions": [{"Status": "Training", "StartTime": now}],
            "Tags": request.get("Tags", []),
        }
        if self.on_created is not None:
            self.on_created(JobName, copy.deepcopy(self.jobs[JobName]))
        return {"JobArn": self.jobs[JobName]["JobArn"]}

    def describe_job(self, JobName: str, JobCategory: str) -> dict[str, Any]:  # noqa: N803
        return copy.deepcopy(self._job(JobName, JobCategory))

    def stop_job(self, JobName: str, JobCategory: str) -> dict[str, Any]:  # noqa: N803
        job = self._job(JobName, JobCategory)
        if job["JobStatus"] == "InProgress":
            self.finish(JobName, "Stopped")
        return {}

    def finish(self, name: str, status: str, reason: str | None = None) -> None:
        """The job ends: Completed (a training job's trained model registered as a version of
        its document's output group, named in its ServiceOutput with the tokens billed), Failed
        (with `reason`) or Stopped."""
        job, now = self.jobs[name], _now()
        job |= {"JobStatus": status, "SecondaryStatus": status, "EndTime": now}
        if status == "Completed" and job["JobCategory"] == "AgentRFT":
            document = json.loads(job["JobConfigDocument"])
            group = document["ModelPackageConfig"]["OutputModelPackageGroupArn"]
            package = group.replace(":model-package-group/", ":model-package/") + "/1"
            document["ServiceOutput"] = {
                "OutputModelPackageArn": package,
                "BillableTokenUsage": BILLED_TOKENS,
            }
            job["JobConfigDocument"] = json.dumps(document)
        job["SecondaryStatusTransitions"].append({"Status": status, "StartTime": now})
        if reason:
            job["FailureReason"] = reason

    def describe_hub_content(
        self,
        HubName: str,
        HubContentType: str,
        HubContentName: str,
        **_: Any,  # noqa: N803
    ) -> dict[str, Any]:
        if HubName != "SageMakerPublicHub" or HubContentType != "Model":
            raise AwsError("ResourceNotFound", f"Hub content {HubName}/{HubContentName} not found")
        return public_hub_model(HubContentName, REGION)
