"""The physical names a synthesized stack's resources get when deployed locally, and the
CloudFormation intrinsics resolved against them.

Names follow the template's own name properties where it sets them (a bucket, a cluster, a
state machine named from the configuration), otherwise `local-<logical id>`; ARNs are built as
AWS builds them for the local account and region. Every stack of an app can be named this way,
so references between stacks (exports and imports) resolve to the same values everywhere.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

ACCOUNT, REGION = "123456789012", "us-east-1"
PSEUDO = {
    "AWS::AccountId": ACCOUNT,
    "AWS::Region": REGION,
    "AWS::Partition": "aws",
    "AWS::URLSuffix": "amazonaws.com",
    "AWS::NoValue": None,
}
# The property that names a resource, per type (absent: `local-<logical id>`).
NAME_PROPERTY = {
    "AWS::S3::Bucket": "BucketName",
    "AWS::Logs::LogGroup": "LogGroupName",
    "AWS::ECS::Cluster": "ClusterName",
    "AWS::ECS::TaskDefinition": "Family",
    "AWS::EKS::Cluster": "Name",
    "AWS::SageMaker::Cluster": "ClusterName",
    "AWS::StepFunctions::StateMachine": "StateMachineName",
    "AWS::ECR::Repository": "RepositoryName",
    "AWS::IAM::Role": "RoleName",
    "AWS::Lambda::Function": "FunctionName",
    "AWS::SQS::Queue": "QueueName",
    "AWS::DynamoDB::Table": "TableName",
    "AWS::SNS::Topic": "TopicName",
    "AWS::Events::Rule": "Name",
    "AWS::SageMaker::ModelPackageGroup": "ModelPackageGroupName",
}


def _arns(kind: str, name: str, logical_id: str) -> dict[str, Any]:
    """Ref and attributes of a resource of `kind` named `name`."""
    prefix = f"arn:aws:{{}}:{REGION}:{ACCOUNT}"
    short = hashlib.sha256(logical_id.encode()).hexdigest()
    match kind:
        case "AWS::DynamoDB::Table":
            return {"Ref": name, "Arn": f"{prefix.format('dynamodb')}:table/{name}"}
        case "AWS::SNS::Topic":
            arn = f"{prefix.format('sns')}:{name}"
            return {"Ref": arn, "TopicArn": arn, "TopicName": name}
        case "AWS::KMS::Key":
            key_id = f"{short[:8]}-{short[8:12]}-{short[12:16]}-{short[16:20]}-{short[20:32]}"
            return {"Ref": key_id, "KeyId": key_id, "Arn": f"{prefix.format('kms')}:key/{key_id}"}
        case "AWS::IAM::Role":
            return {"Ref": name, "Arn": f"arn:aws:iam::{ACCOUNT}:role/{name}", "RoleId": short[:21]}
        case "AWS::Lambda::Function":
            return {"Ref": name, "Arn": f"{prefix.format('lambda')}:function:{name}"}
        case "AWS::Lambda::Url":
            # Local mode serves URLs itself (mtrl/local/function_url.py) and overrides them.
            return {"Ref": logical_id, "FunctionUrl": "http://127.0.0.1/"}
        case "AWS::StepFunctions::StateMachine":
            return {"Ref": f"{prefix.format('states')}:stateMachine:{name}", "Name": name}
        case "AWS::SQS::Queue":
            url = f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{name}"
            arn = f"{prefix.format('sqs')}:{name}"
            return {"Ref": url, "QueueUrl": url, "Arn": arn, "QueueName": name}
        case "AWS::S3::Bucket":
            return {
                "Ref": name,
                "Arn": f"arn:aws:s3:::{name}",
                "DomainName": f"{name}.s3.amazonaws.com",
                "RegionalDomainName": f"{name}.s3.{REGION}.amazonaws.com",
            }
        case "AWS::Logs::LogGroup":
            return {"Ref": name, "Arn": f"{prefix.format('logs')}:log-group:{name}:*"}
        case "AWS::ECS::Cluster":
            return {"Ref": name, "Arn": f"{prefix.format('ecs')}:cluster/{name}"}
        case "AWS::ECS::TaskDefinition":
            arn = f"{prefix.format('ecs')}:task-definition/{name}:1"
            return {"Ref": arn, "TaskDefinitionArn": arn}
        case "AWS::EKS::Cluster":
            return {
                "Ref": name,
                "Arn": f"{prefix.format('eks')}:cluster/{name}",
                "Endpoint": f"https://{short[:32].upper()}.gr7.{REGION}.eks.amazonaws.com",
                "ClusterSecurityGroupId": f"sg-{short[:17]}",
            }
        case "AWS::SageMaker::Cluster":
            # HyperPod cluster ARNs end in an id SageMaker assigns, not in the name.
            return {"Ref": name, "ClusterArn": f"{prefix.format('sagemaker')}:cluster/{short[:12]}"}
        case "AWS::ECR::Repository":
            return {"Ref": name, "Arn": f"{prefix.format('ecr')}:repository/{name}"}
        case "AWS::Events::Rule":
            return {"Ref": name, "Arn": f"{prefix.format('events')}:rule/{name}"}
        case "AWS::EC2::SecurityGroup":
            return {"Ref": f"sg-{short[:17]}", "GroupId": f"sg-{short[:17]}"}
        case "AWS::EC2::Subnet":
            return {"Ref": f"subnet-{short[:17]}", "SubnetId": f"subnet-{short[:17]}"}
        case "AWS::EC2::VPC":
            return {"Ref": f"vpc-{short[:17]}", "VpcId": f"vpc-{short[:17]}"}
    return {"Ref": name}


class LocalNames(Mapping[str, dict[str, Any]]):
    """logical id -> {"Ref": ..., attribute: ...} for one template, made on first use;
    `known` names what exists already under ids of its own (a subnet made by moto)."""

    def __init__(
        self,
        template: dict[str, Any],
        imports: Mapping[str, str] | None = None,
        known: Mapping[str, dict[str, Any]] | None = None,
    ) -> None:
        self._resources = template.get("Resources", {})
        self._made: dict[str, dict[str, Any]] = dict(known or {})
        self.resolve = Resolver(self, imports or {})

    def __getitem__(self, logical_id: str) -> dict[str, Any]:
        if logical_id not in self._made:
            resource = self._resources[logical_id]
            kind = resource["Type"]
            given = resource.get("Properties", {}).get(NAME_PROPERTY.get(kind, ""))
            name = str(self.resolve(given)) if given is not None else f"local-{logical_id}"[:64]
            self._made[logical_id] = _arns(kind, name, logical_id)
        return self._made[logical_id]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._resources)

    def __len__(self) -> int:
        return len(self._resources)


class Resolver:
    """CloudFormation intrinsics, resolved against the local names of a stack's resources."""

    def __init__(self, names: Mapping[str, dict[str, Any]], imports: Mapping[str, str]) -> None:
        self.names = names
        self.imports = imports

    def __call__(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self(item) for item in value]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((function, argument),) = value.items()
            if function == "Ref":
                return PSEUDO[argument] if argument in PSEUDO else self.names[argument]["Ref"]
            if function == "Fn::GetAtt":
                resource, attribute = (
                    argument.split(".", 1) if isinstance(argument, str) else argument
                )
                names = self.names[resource]
                return names.get(attribute, f"{names['Ref']}-{attribute}")
            if function == "Fn::Join":
                return argument[0].join(str(self(part)) for part in argument[1])
            if function == "Fn::Select":
                return self(argument[1])[int(self(argument[0]))]
            if function == "Fn::Split":
                return str(self(argument[1])).split(argument[0])
            if function == "Fn::ImportValue":
                return self.imports.get(str(self(argument)), "")
            if function == "Fn::Sub":
                return self._sub(argument)
        return {key: self(item) for key, item in value.items()}

    def _sub(self, argument: Any) -> str:
        text, variables = (argument, {}) if isinstance(argument, str) else argument
        out, rest = [], text
        while "${" in rest:
            before, _, rest = rest.partition("${")
            name, _, rest = rest.partition("}")
            out.append(before)
            if name in variables:
                out.append(str(self(variables[name])))
            elif "." in name:
                out.append(str(self({"Fn::GetAtt": name})))
            else:
                out.append(str(self({"Ref": name})))
        return "".join(out) + rest


def exports(
    templates: Mapping[str, dict[str, Any]],
    known: Mapping[str, Mapping[str, dict[str, Any]]] | None = None,
) -> dict[str, str]:
    """Every stack's exported values, by export name: a stack is resolved once the stacks whose
    exports it imports are (an import from outside the app resolves to "")."""
    values: dict[str, str] = {}
    pending = dict(templates)
    while pending:
        ready = [
            stack
            for stack, template in pending.items()
            if not _imported(template) & _exported({k: t for k, t in pending.items() if k != stack})
        ]
        if not ready:
            raise ValueError(f"circular exports between {sorted(pending)}")
        for stack in ready:
            template = pending.pop(stack)
            resolve = LocalNames(template, values, (known or {}).get(stack)).resolve
            for output in template.get("Outputs", {}).values():
                if "Export" in output:
                    values[str(resolve(output["Export"]["Name"]))] = str(resolve(output["Value"]))
    return values


def _imported(template: dict[str, Any]) -> set[str]:
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if set(value) == {"Fn::ImportValue"} and isinstance(value["Fn::ImportValue"], str):
                found.add(value["Fn::ImportValue"])
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(template)
    return found


def _exported(templates: Mapping[str, dict[str, Any]]) -> set[str]:
    return {
        output["Export"]["Name"]
        for template in templates.values()
        for output in template.get("Outputs", {}).values()
        if "Export" in output
    }
