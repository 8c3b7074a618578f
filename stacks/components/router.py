"""The rollout router's long-lived part: conversation table, proxy (Function URL), consumer.

Per-run queues, event source mappings and queue-age alarms are created per run by the
pipeline (domain/run_queues.py, lambdas/router/alarms.py); this construct provides the
needs about them (stacks/components/access.py) by name prefix, since their names are only known
at run time.
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from domain.naming import run_prefix
from domain.needs import Need
from domain.nova_job import rollout_function_name
from domain.tables import CONVERSATION_EXPIRY, CONVERSATION_PARTITION_KEY, CONVERSATION_SORT_KEY
from lambdas.environment import environment_for
from lambdas.router.settings import ForwarderSettings, RouterSettings
from stacks.components.access import Allow, alarm_arn, grant_table_action
from stacks.components.functions import pipeline_function
from stacks.components.nag import Wildcard
from stacks.components.tables import data_table

PROXY_HANDLER = "lambdas.router.proxy.handler"
CONSUMER_HANDLER = "lambdas.router.consumer.handler"
FORWARDER_HANDLER = "lambdas.router.rollout_forwarder.handler"


class Router(Construct):
    """Attributes: `table`, `proxy`, `proxy_url`, `consumer`, `rollout_forwarder`,
    `run_queue_arns`; provides the needs about conversations, run queues, their alarms, the
    consumer and the forwarder's per-run aliases (`provides`, `grant`)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        name_prefix: str,
        reserved_concurrency: int | None,
        code: lambda_.Code,
        data_key: kms.IKey,
    ) -> None:
        """`reserved_concurrency`: reserved for each of its functions (none: the account's
        pool)."""
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.table = data_table(
            self,
            "Conversations",
            data_key=data_key,
            partition_key=CONVERSATION_PARTITION_KEY,
            sort_key=CONVERSATION_SORT_KEY,
            time_to_live_attribute=CONVERSATION_EXPIRY,
            # Conversation state lives days (TTL); nothing to keep once the stack is gone.
            removal_policy=RemovalPolicy.DESTROY,
        )
        # Per-run queues are named `<prefix>-run-<run id>-<kind>.fifo` (run_queues.queue_name).
        self.run_queue_arns = stack.format_arn(
            service="sqs", resource=f"{run_prefix(name_prefix)}*"
        )
        self.proxy = pipeline_function(
            self,
            "Proxy",
            handler=PROXY_HANDLER,
            description="Rollout router proxy: OpenAI-shaped API over the run's queues",
            code=code,
            timeout=Duration.seconds(30),
            environment=environment_for(
                RouterSettings,
                table_name=self.table.table_name,
                wait_seconds=5,
                deployment=name_prefix,
            ),
            log_key=data_key,
            invocation="Its function URL is called synchronously: the caller, a run's reward "
            "worker, sees each error and retries",
            reserved_concurrency=reserved_concurrency,
        )
        self.proxy_url = self.proxy.add_function_url(auth_type=lambda_.FunctionUrlAuthType.AWS_IAM)
        self.consumer = pipeline_function(
            self,
            "Consumer",
            handler=CONSUMER_HANDLER,
            description="Rollout router: records generate responses in the conversation table",
            code=code,
            timeout=Duration.seconds(60),
            environment=environment_for(
                RouterSettings, table_name=self.table.table_name, deployment=name_prefix
            ),
            log_key=data_key,
            invocation="A run's generate-response queue invokes it synchronously through its "
            "event source mapping: a message it fails stays on that queue, redelivered",
            reserved_concurrency=reserved_concurrency,
        )
        # A Nova job's rollout_request_arn, unqualified: it serves the run that holds its lease
        # (lambdas/router/rollout_forwarder.py). Named as AWS's tools want a Nova job's Lambda
        # named (domain/nova_job.py).
        self.rollout_forwarder = pipeline_function(
            self,
            "RolloutForwarder",
            function_name=rollout_function_name(name_prefix),
            handler=FORWARDER_HANDLER,
            description="Rollout router: puts a Nova trainer's rollout requests on the run's queue",
            code=code,
            timeout=Duration.seconds(30),
            environment=environment_for(
                ForwarderSettings, name_prefix=name_prefix, table_name=self.table.table_name
            ),
            log_key=data_key,
            invocation="A Nova trainer invokes it synchronously (RequestResponse) and sees each "
            "error at once",
            reserved_concurrency=reserved_concurrency,
        )
        self._data_key = data_key
        self._alarms = alarm_arn(stack, f"{run_prefix(name_prefix)}*")
        # Event source mappings have run-time ids: any mapping, but only of the consumer.
        self._mappings = stack.format_arn(
            service="lambda",
            resource="event-source-mapping",
            resource_name="*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        # Per run, under the deployment's prefix: the queues, their age alarms. Event source
        # mapping ids are Lambda's; the condition keeps them to the consumer's mappings.
        self._allow = Allow(
            {
                self.run_queue_arns: Wildcard.NAMED_AT_RUN_TIME,
                self._alarms: Wildcard.NAMED_AT_RUN_TIME,
                self._mappings: Wildcard.ASSIGNED_BY_AWS,
            }
        )

    provides = frozenset(
        {
            Need.CONVERSATIONS_GET,
            Need.CONVERSATIONS_QUERY,
            Need.CONVERSATIONS_PUT,
            Need.CONVERSATIONS_UPDATE,
            Need.CONVERSATIONS_DELETE,
            Need.RUN_QUEUES_CREATE,
            Need.RUN_QUEUES_DELETE,
            Need.RUN_QUEUES_PURGE,
            Need.RUN_QUEUES_SEND,
            Need.RUN_QUEUES_RECEIVE,
            Need.RUN_QUEUES_POLL,
            Need.QUEUE_ALARMS_CREATE,
            Need.QUEUE_ALARMS_DELETE,
            Need.CONSUMER_CONNECT,
            Need.CONSUMER_DISCONNECT,
            Need.PROXY_INVOKE,
            Need.QUEUES_WATCH,
            Need.ROLLOUT_REQUESTS_FORWARD,
            Need.ROLLOUT_LAMBDA_INVOKE,
        }
    )

    def grant(self, need: Need, role: iam.IRole) -> None:  # noqa: C901 - one case per need
        queues, key = self.run_queue_arns, self._data_key.key_arn
        match need:
            case Need.CONVERSATIONS_GET | Need.CONVERSATIONS_QUERY:
                action = "GetItem" if need is Need.CONVERSATIONS_GET else "Query"
                grant_table_action(
                    role, f"dynamodb:{action}", self.table, self._data_key, writes=False
                )
            case Need.CONVERSATIONS_PUT | Need.CONVERSATIONS_UPDATE | Need.CONVERSATIONS_DELETE:
                action = {
                    Need.CONVERSATIONS_PUT: "PutItem",
                    Need.CONVERSATIONS_UPDATE: "UpdateItem",
                    Need.CONVERSATIONS_DELETE: "DeleteItem",
                }[need]
                grant_table_action(
                    role, f"dynamodb:{action}", self.table, self._data_key, writes=True
                )
            case Need.RUN_QUEUES_CREATE:
                # Tagging on creation needs sqs:TagQueue (SQS API Reference, CreateQueue).
                self._allow(
                    role, ["sqs:CreateQueue", "sqs:TagQueue", "sqs:GetQueueAttributes"], queues
                )
            case Need.RUN_QUEUES_DELETE:
                self._allow(role, ["sqs:GetQueueUrl", "sqs:DeleteQueue"], queues)
                # ListQueues has no resource type (Service Authorization Reference).
                self._allow(role, ["sqs:ListQueues"], "*")
            case Need.RUN_QUEUES_PURGE:
                self._allow(role, ["sqs:PurgeQueue"], queues)
            case Need.RUN_QUEUES_SEND:
                # Producers to an SSE-KMS queue (SQS Developer Guide, "Key management").
                self._allow(role, ["sqs:SendMessage"], queues)
                self._allow(role, ["kms:GenerateDataKey", "kms:Decrypt"], key)
            case Need.RUN_QUEUES_RECEIVE:
                # Consumers of an SSE-KMS queue decrypt (SQS Developer Guide, "Key management");
                # a long piece of work extends its message's visibility.
                actions = ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility"]
                self._allow(role, actions, queues)
                self._allow(role, ["kms:Decrypt"], key)
            case Need.RUN_QUEUES_POLL:
                # The execution role of a function an SQS queue triggers (Lambda Developer Guide,
                # "Using Lambda with Amazon SQS").
                actions = ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"]
                self._allow(role, actions, queues)
                self._allow(role, ["kms:Decrypt"], key)
            case Need.QUEUE_ALARMS_CREATE:
                self._allow(
                    role, ["cloudwatch:PutMetricAlarm", "cloudwatch:TagResource"], self._alarms
                )
            case Need.QUEUE_ALARMS_DELETE:
                self._allow(
                    role, ["cloudwatch:DeleteAlarms", "cloudwatch:DescribeAlarms"], self._alarms
                )
            case Need.CONSUMER_CONNECT | Need.CONSUMER_DISCONNECT:
                # Creating has no resource type; the condition names the consumer either way.
                action, resource = (
                    ("lambda:CreateEventSourceMapping", "*")
                    if need is Need.CONSUMER_CONNECT
                    else ("lambda:DeleteEventSourceMapping", self._mappings)
                )
                self._allow(
                    role,
                    [action],
                    resource,
                    conditions={"StringEquals": {"lambda:FunctionArn": self.consumer.function_arn}},
                )
                self._allow(role, ["lambda:ListEventSourceMappings"], "*")
            case Need.PROXY_INVOKE:
                self.proxy.grant_invoke_url(role)
            case Need.ROLLOUT_REQUESTS_FORWARD:
                # The run's queue is found by name; a producer to an SSE-KMS queue (SQS
                # Developer Guide, "Key management").
                self._allow(role, ["sqs:GetQueueUrl", "sqs:SendMessage"], queues)
                self._allow(role, ["kms:GenerateDataKey", "kms:Decrypt"], key)
            case Need.ROLLOUT_LAMBDA_INVOKE:
                # The function's ARN, unqualified, as a job's recipe names it (the Forge SDK's
                # form); a version or an alias would be another resource.
                self._allow(role, ["lambda:InvokeFunction"], self.rollout_forwarder.function_arn)
            case Need.QUEUES_WATCH:
                self._allow(role, ["sqs:GetQueueUrl", "sqs:GetQueueAttributes"], queues)
                # GetMetricData has no resource type (Service Authorization Reference).
                self._allow(role, ["cloudwatch:GetMetricData"], "*")
