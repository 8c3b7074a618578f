"""The rollout router's long-lived part: conversation table, proxy (Function URL), consumer.

Per-run queues, event source mappings and queue-age alarms are created per run by the
pipeline (lambdas/router/run_queues.py, lambdas/router/alarms.py); this construct grants its
functions access to them by name prefix, since their names are only known at run time.
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from lambdas.router.conversations import PARTITION_KEY, SORT_KEY, TTL_ATTRIBUTE
from lambdas.router.run_queues import deployment_prefix
from stacks.components.functions import pipeline_function
from stacks.components.nag import acknowledge_key_grant, acknowledge_resource
from stacks.config import PlatformConfig


class Router(Construct):
    """Attributes: `table`, `proxy`, `proxy_url`, `consumer`, `run_queue_arns`."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: PlatformConfig,
        code: lambda_.Code,
        data_key: kms.IKey,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.table = dynamodb.Table(
            self,
            "Conversations",
            partition_key=dynamodb.Attribute(
                name=PARTITION_KEY, type=dynamodb.AttributeType.STRING
            ),
            sort_key=dynamodb.Attribute(name=SORT_KEY, type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            time_to_live_attribute=TTL_ATTRIBUTE,
            encryption=dynamodb.TableEncryption.CUSTOMER_MANAGED,
            encryption_key=data_key,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            # Conversation state lives days (TTL); nothing to keep once the stack is gone.
            removal_policy=RemovalPolicy.DESTROY,
        )
        # Per-run queues are named `<prefix>-<run id>-<kind>.fifo` (run_queues.queue_name).
        self.run_queue_arns = stack.format_arn(
            service="sqs", resource=f"{deployment_prefix(config.name_prefix)}*"
        )
        self.proxy = pipeline_function(
            self,
            "Proxy",
            handler="lambdas.router.proxy.handler",
            description="Rollout router proxy: OpenAI-shaped API over the run's queues",
            code=code,
            timeout=Duration.seconds(30),
            environment={"TABLE_NAME": self.table.table_name, "WAIT_SECONDS": "5"},
        )
        self.proxy_url = self.proxy.add_function_url(auth_type=lambda_.FunctionUrlAuthType.AWS_IAM)
        self.consumer = pipeline_function(
            self,
            "Consumer",
            handler="lambdas.router.consumer.handler",
            description="Rollout router: records generate responses in the conversation table",
            code=code,
            timeout=Duration.seconds(60),
            environment={"TABLE_NAME": self.table.table_name},
        )
        for function in (self.proxy, self.consumer):
            self.table.grant_read_write_data(function)
        self.proxy.add_to_role_policy(
            iam.PolicyStatement(actions=["sqs:SendMessage"], resources=[self.run_queue_arns])
        )
        self.consumer.add_to_role_policy(run_queue_access(self.run_queue_arns))
        # The run queues are encrypted with the data key (SSE-KMS).
        data_key.grant_encrypt_decrypt(self.proxy)
        data_key.grant_decrypt(self.consumer)
        for function in (self.proxy, self.consumer):
            role = function.role
            acknowledge_resource(
                role,
                "AwsSolutions-IAM5",
                self.run_queue_arns,
                "Per-run queues are created by the pipeline at run time; their names share the "
                "deployment's prefix, which is as narrow as a name known at deploy time can be.",
            )
            acknowledge_key_grant(role, "the conversation table and the run queues")

    def grant_invoke_url(self, grantee: iam.IGrantable) -> None:
        """Let a reward-worker role call the proxy's Function URL (SigV4)."""
        self.proxy.grant_invoke_url(grantee)


def run_queue_access(run_queue_arns: str, *, send: bool = False) -> iam.PolicyStatement:
    """Consume the run queues (and, with `send`, send to them): the router's consumer, the
    reward workers and a run's pods each take their side of the rollout protocol."""
    actions = [
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:ChangeMessageVisibility",
        "sqs:GetQueueAttributes",
    ]
    return iam.PolicyStatement(
        actions=[*actions, "sqs:SendMessage"] if send else actions, resources=[run_queue_arns]
    )
