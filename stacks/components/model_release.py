"""Where trained models go out (`mtrl deploy`): the deployment's SageMaker Model Registry group,
where each released model is registered with its evaluation and the run it came from, and the
role Amazon Bedrock assumes to import a Nova checkpoint as a custom model.

The import role reads what the Nova Forge SDK's own Bedrock execution role reads: Nova's
checkpoints in AWS's escrow buckets of the account, `customer-escrow-<account>…` (amzn-nova-forge
1.4.10, iam/iam_role_creator.py `create_bedrock_execution_role` and iam/bedrock_policies.json).
"""

from __future__ import annotations

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct

from stacks.components.access import Allow
from stacks.components.nag import Wildcard
from stacks.components.needs import Need
from stacks.config import PlatformConfig

BEDROCK = "bedrock.amazonaws.com"


class ModelRelease(Construct):
    provides = frozenset({Need.MODELS_REGISTER, Need.MODELS_RELEASE})

    def __init__(self, scope: Construct, construct_id: str, *, config: PlatformConfig) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.group_name = f"{config.name_prefix}-models"
        self.group = sagemaker.CfnModelPackageGroup(
            self,
            "Models",
            model_package_group_name=self.group_name,
            model_package_group_description="Models trained by nova-mtrl runs (mtrl deploy)",
        )
        self.group_arn = stack.format_arn(
            service="sagemaker", resource="model-package-group", resource_name=self.group_name
        )
        self.import_role = iam.Role(
            self,
            "BedrockImport",
            assumed_by=iam.ServicePrincipal(BEDROCK).with_conditions(
                {"StringEquals": {"aws:SourceAccount": stack.account}}
            ),
            description="Amazon Bedrock imports a Nova checkpoint a run trained (mtrl deploy)",
        )
        escrow = f"arn:aws:s3:::customer-escrow-{stack.account}*"
        # AWS names a Nova job's escrow bucket per job: only the account's escrow buckets.
        buckets = Wildcard.ASSIGNED_BY_AWS
        Allow({escrow: buckets, f"{escrow}/*": buckets})(
            self.import_role, ["s3:GetObject", "s3:ListBucket"], escrow, f"{escrow}/*"
        )
        self._packages = stack.format_arn(
            service="sagemaker", resource="model-package", resource_name=f"{self.group_name}/*"
        )
        self._models = stack.format_arn(
            service="bedrock", resource="custom-model", resource_name="*"
        )
        self._deployments = stack.format_arn(
            service="bedrock", resource="custom-model-deployment", resource_name="*"
        )
        # SageMaker numbers a group's versions; Bedrock ids its models and deployments.
        self._allow = Allow(
            {
                self._packages: Wildcard.ASSIGNED_BY_AWS,
                self._models: Wildcard.ASSIGNED_BY_AWS,
                self._deployments: Wildcard.ASSIGNED_BY_AWS,
            }
        )

    def grant(self, need: Need, role: iam.IRole) -> None:
        """Collect: a model package version in the group. The operator: pass the import role to
        Bedrock, create, watch and delete the custom models and deployments."""
        allow = self._allow
        if need is Need.MODELS_REGISTER:
            allow(role, ["sagemaker:CreateModelPackage"], self.group_arn, self._packages)
            return
        allow(
            role, ["iam:PassRole"], self.import_role.role_arn,
            conditions={"StringEquals": {"iam:PassedToService": BEDROCK}},
        )  # fmt: skip
        # CreateCustomModel has no resource type (Service Authorization Reference).
        allow(role, ["bedrock:CreateCustomModel"], "*")
        # CreateCustomModelDeployment is authorized on the model.
        allow(
            role,
            [
                "bedrock:GetCustomModel",
                "bedrock:DeleteCustomModel",
                "bedrock:CreateCustomModelDeployment",
            ],
            self._models,
        )
        allow(
            role,
            ["bedrock:GetCustomModelDeployment", "bedrock:DeleteCustomModelDeployment"],
            self._deployments,
        )
