"""Where trained models go out (`mtrl deploy`): the deployment's SageMaker Model Registry group,
where each released model is registered with its evaluation and the run it came from; the role
Amazon Bedrock assumes to import a Nova checkpoint as a custom model; and the role a SageMaker
endpoint serves an open-weights checkpoint with (mtrl/ops/endpoint.py).

The import role reads what the Nova Forge SDK's own Bedrock execution role reads: Nova's
checkpoints in AWS's escrow buckets of the account, `customer-escrow-<account>…` (amzn-nova-forge
1.4.10, iam/iam_role_creator.py `create_bedrock_execution_role` and iam/bedrock_policies.json).

The serving role (a SageMaker model's execution role) reads the run's checkpoint (the data
bucket's grant, stacks/components/access.py), pulls AWS's vLLM image from the Deep Learning
Containers' registry of the region and writes the endpoint's logs — what the SageMaker Developer
Guide's "CreateModel API: Execution Role Permissions" lists, each narrowed to this deployment's
endpoints and that one repository (the page is not in this project's library: unverified).
"""

from __future__ import annotations

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct

from domain.naming import DEPLOYMENT_TAG, model_group_name, run_prefix
from domain.needs import Need
from stacks.components.access import Allow, log_group_arn
from stacks.components.nag import Wildcard

BEDROCK = "bedrock.amazonaws.com"
SAGEMAKER = "sagemaker.amazonaws.com"
SERVING_REPOSITORY = "vllm"  # AWS's vLLM DLC (mtrl/ops/serving_image.py)


class ModelRelease(Construct):
    provides = frozenset({Need.MODELS_REGISTER, Need.MODELS_RELEASE})

    def __init__(self, scope: Construct, construct_id: str, *, name_prefix: str) -> None:
        """`name_prefix`: the deployment's (the group's name, the tags it may delete by)."""
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.group_name = model_group_name(name_prefix)
        # What the operator may delete on Bedrock: what `mtrl deploy` tagged as this deployment's.
        self._ours = {"StringEquals": {f"aws:ResourceTag/{DEPLOYMENT_TAG}": name_prefix}}
        self._tagged_ours = {"StringEquals": {f"aws:RequestTag/{DEPLOYMENT_TAG}": name_prefix}}
        self.group = sagemaker.CfnModelPackageGroup(
            self,
            "Models",
            model_package_group_name=self.group_name,
            model_package_group_description="Models trained by nova-mtrl runs (mtrl deploy)",
        )
        self.group_arn = stack.format_arn(
            service="sagemaker", resource="model-package-group", resource_name=self.group_name
        )
        self.import_role = self._role_of(
            "BedrockImport", BEDROCK,
            "Amazon Bedrock imports a Nova checkpoint a run trained (mtrl deploy)",
        )  # fmt: skip
        escrow = f"arn:aws:s3:::customer-escrow-{stack.account}*"
        # AWS names a Nova job's escrow bucket per job: only the account's escrow buckets.
        buckets = Wildcard.ASSIGNED_BY_AWS
        Allow({escrow: buckets, f"{escrow}/*": buckets})(
            self.import_role, ["s3:GetObject", "s3:ListBucket"], escrow, f"{escrow}/*"
        )
        self.serving_role = self._role_of(
            "Serving", SAGEMAKER,
            "A SageMaker endpoint serves a run's open-weights checkpoint (mtrl deploy)",
        )  # fmt: skip
        # The Deep Learning Containers' registry is an AWS account that differs by region.
        dlc = f"arn:{stack.partition}:ecr:{stack.region}:*:repository/{SERVING_REPOSITORY}"
        # The endpoints' log groups, in the form IAM names a log group's streams with.
        endpoint_logs = log_group_arn(stack, f"/aws/sagemaker/Endpoints/{run_prefix(name_prefix)}*")
        serving = Allow({dlc: Wildcard.ASSIGNED_BY_AWS, endpoint_logs: Wildcard.NAMED_AT_RUN_TIME})
        serving(
            self.serving_role,
            ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"],
            dlc,
        )
        serving(self.serving_role, ["ecr:GetAuthorizationToken"], "*")
        serving(
            self.serving_role,
            ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents",
             "logs:DescribeLogStreams"],
            endpoint_logs,
        )  # fmt: skip
        # SageMaker lowercases its resources' names in their ARNs; the prefix is lowercase.
        hosting = {
            kind: stack.format_arn(
                service="sagemaker",
                resource=kind,
                resource_name=f"{run_prefix(name_prefix)}*",
            )
            for kind in ("model", "endpoint-config", "endpoint")
        }
        self._hosting = hosting
        self._packages = stack.format_arn(
            service="sagemaker", resource="model-package", resource_name=f"{self.group_name}/*"
        )
        self._models = stack.format_arn(
            service="bedrock", resource="custom-model", resource_name="*"
        )
        self._deployments = stack.format_arn(
            service="bedrock", resource="custom-model-deployment", resource_name="*"
        )
        # SageMaker numbers a group's versions; Bedrock ids its models and deployments; a
        # release's SageMaker resources are named after its run.
        self._allow = Allow(
            {
                self._packages: Wildcard.ASSIGNED_BY_AWS,
                self._models: Wildcard.ASSIGNED_BY_AWS,
                self._deployments: Wildcard.ASSIGNED_BY_AWS,
                **dict.fromkeys(hosting.values(), Wildcard.NAMED_AT_RUN_TIME),
            }
        )

    def _role_of(self, construct_id: str, service: str, description: str) -> iam.Role:
        """A role `service` assumes for this account only (confused deputy)."""
        return iam.Role(
            self,
            construct_id,
            assumed_by=iam.ServicePrincipal(service).with_conditions(
                {"StringEquals": {"aws:SourceAccount": Stack.of(self).account}}
            ),
            description=description,
        )

    def grant(self, need: Need, role: iam.IRole) -> None:
        """Collect: a model package version in the group. The operator: pass the import role to
        Bedrock (or let it read a managed job's package), create, watch and delete the custom
        models and deployments; pass the serving
        role to SageMaker, create, watch and delete the models, endpoint configs and
        endpoints."""
        allow = self._allow
        if need is Need.MODELS_REGISTER:
            allow(role, ["sagemaker:CreateModelPackage"], self.group_arn, self._packages)
            return
        allow(
            role, ["iam:PassRole"], self.import_role.role_arn,
            conditions={"StringEquals": {"iam:PassedToService": BEDROCK}},
        )  # fmt: skip
        # CreateCustomModel has no resource type (Service Authorization Reference): only a
        # model tagged as this deployment's. Models and deployments are read by name (a name
        # not there is an answer too); only this deployment's tagged ones are deployed or
        # deleted (aws:ResourceTag, a condition key of each, Service Authorization Reference).
        allow(role, ["bedrock:CreateCustomModel"], "*", conditions=self._tagged_ours)
        # A serverless run's model is the package its managed job registered in the group:
        # Bedrock imports it by ARN with the caller's permissions to describe it and read its
        # data (Bedrock API reference, ModelPackageArnDataSource, which names the second
        # `AccessModelPackageData`; the Service Authorization Reference and AWS's managed
        # policies name it sagemaker:AccessModelPackage).
        allow(
            role, ["sagemaker:DescribeModelPackage", "sagemaker:AccessModelPackage"], self._packages
        )
        allow(role, ["bedrock:GetCustomModel"], self._models)
        allow(
            role,
            ["bedrock:DeleteCustomModel", "bedrock:CreateCustomModelDeployment"],
            self._models,
            conditions=self._ours,
        )
        allow(role, ["bedrock:GetCustomModelDeployment"], self._deployments)
        allow(
            role, ["bedrock:DeleteCustomModelDeployment"], self._deployments, conditions=self._ours
        )
        # An open-weights model on a SageMaker endpoint: the model (passing the serving role),
        # its endpoint config and endpoint, each tagged as it is made; CreateEndpoint is
        # authorized on the endpoint and its config (Service Authorization Reference).
        allow(
            role, ["iam:PassRole"], self.serving_role.role_arn,
            conditions={"StringEquals": {"iam:PassedToService": SAGEMAKER}},
        )  # fmt: skip
        model, config, endpoint = (
            self._hosting[kind] for kind in ("model", "endpoint-config", "endpoint")
        )
        allow(
            role,
            ["sagemaker:CreateModel", "sagemaker:DescribeModel", "sagemaker:DeleteModel"],
            model,
        )
        allow(
            role,
            ["sagemaker:CreateEndpointConfig", "sagemaker:DescribeEndpointConfig",
             "sagemaker:DeleteEndpointConfig"],
            config,
        )  # fmt: skip
        allow(role, ["sagemaker:CreateEndpoint"], endpoint, config)
        allow(role, ["sagemaker:DescribeEndpoint", "sagemaker:DeleteEndpoint"], endpoint)
        allow(role, ["sagemaker:AddTags"], model, config, endpoint)
