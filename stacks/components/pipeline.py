"""The training pipeline: the upload rule -> the start function -> the state machine of thin
step functions (stacks/components/pipeline_states.py), the runs table and the alert topic, the
reaper on a schedule, and monitoring (stacks/components/pipeline_monitoring.py). Which functions
there are, and what each needs, is the step table (lambdas/pipeline/steps.py)."""

from __future__ import annotations

from aws_cdk import ArnFormat, Duration, RemovalPolicy, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from domain.needs import Need
from lambdas.environment import environment_for
from lambdas.pipeline.settings import PipelineSettings
from lambdas.pipeline.steps import STEP, STEPS, PipelineStep, Trigger
from stacks.components.access import grant_log_reading, grant_table_action
from stacks.components.functions import ClusterNetwork, pipeline_function
from stacks.components.nag import Wildcard, acknowledge_key_grant, acknowledge_resource
from stacks.components.pipeline_monitoring import (
    alarm,
    errors_alarm_name,
    pipeline_alarms,
    pipeline_dashboard,
)
from stacks.components.pipeline_states import pipeline_state_machine
from stacks.components.pipeline_trigger import trigger_dead_letters, upload_trigger
from stacks.components.tables import data_table
from training_configs.schema import DEFAULT_CONFIG

# Who invokes a step's function and sees its errors (None: it has a dead-letter queue).
INVOKED_BY: dict[Trigger, str | None] = {
    Trigger.STATE_MACHINE: "Step Functions invokes it synchronously and retries or catches each "
    "error; the run's failure path releases, tears down and notifies",
    Trigger.SCHEDULE: "A schedule invokes it (and `mtrl teardown`, synchronously); an invocation "
    "lost after Lambda's retries is done again by the next one",
    Trigger.UPLOAD: None,
}


class TrainingPipeline(Construct):
    """Attributes: `runs_table`, `alert_topic`, `state_machine`, `upload_rule`, `functions` (by
    step name). Provides the needs about runs, executions and alerts (`provides`, `grant`)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        name_prefix: str,
        alert_email: str | None,
        code: lambda_.Code,
        data_bucket: s3.IBucket,
        data_key: kms.IKey,
        conversations: dynamodb.ITable,
        router_url: str,
        consumer: lambda_.IFunction,
        rollout_forwarder: lambda_.IFunction,
        cluster_network: ClusterNetwork,
        model_package_group: str,
    ) -> None:
        super().__init__(scope, construct_id)
        self._cluster_network, self._code, self._data_key = cluster_network, code, data_key
        self.runs_table = data_table(
            self,
            "Runs",
            data_key=data_key,
            partition_key="run_id",
            removal_policy=RemovalPolicy.RETAIN,
        )
        alert_key = kms.Key(
            self, "AlertKey", enable_key_rotation=True, description="Encrypts nova-mtrl alerts"
        )
        alert_key.grant_encrypt_decrypt(iam.ServicePrincipal("cloudwatch.amazonaws.com"))
        self.alert_topic = sns.Topic(
            self, "Alerts", master_key=alert_key, enforce_ssl=True, display_name="nova-mtrl"
        )
        if alert_email:
            self.alert_topic.add_subscription(subscriptions.EmailSubscription(alert_email))
        # What every step function is told (lambdas/pipeline/settings.py).
        self._environment = environment_for(
            PipelineSettings,
            name_prefix=name_prefix,
            runs_table=self.runs_table.table_name,
            conversations_table=conversations.table_name,
            default_config=DEFAULT_CONFIG,
            data_key_arn=data_key.key_arn,
            alert_topic_arn=self.alert_topic.topic_arn,
            router_url=router_url,
            consumer_function=consumer.function_name,
            rollout_lambda_arn=rollout_forwarder.function_arn,
            poll_seconds=60,
            model_package_group=model_package_group,
        )
        self.functions: dict[str, lambda_.Function] = {}
        for step in STEPS:
            if step.trigger is Trigger.STATE_MACHINE:
                self._function(step)
        machine_name = f"{name_prefix}-pipeline"
        self.state_machine, self.execution_logs = pipeline_state_machine(
            self, name=machine_name, functions=dict(self.functions), log_key=data_key
        )
        self._executions = Stack.of(self).format_arn(
            service="states",
            resource="execution",
            resource_name=f"{machine_name}:*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        # An upload must not be lost: an event StartRun still fails after Lambda's retries of the
        # asynchronous invocation goes to the same (alarmed) queue as one EventBridge could not
        # deliver.
        self.trigger_dlq = trigger_dead_letters(self)
        start = self._function(STEP["start_run"], dead_letter_queue=self.trigger_dlq)
        self._on_schedule(
            STEP["reap"],
            self._function(STEP["reap"]),
            every=Duration.minutes(15),
            description="Reaps overdue and orphaned training runs",
        )
        self.upload_rule = upload_trigger(
            self, data_bucket=data_bucket, start=start, dead_letters=self.trigger_dlq
        )
        monitored = {
            "machine": self.state_machine,
            "functions": self.functions,
            "trigger_dlq": self.trigger_dlq,
        }
        pipeline_alarms(self, topic=self.alert_topic, **monitored)
        self.dashboard = pipeline_dashboard(self, name_prefix=name_prefix, **monitored)

    def _function(
        self,
        step: PipelineStep,
        environment: dict[str, str] | None = None,
        *,
        dead_letter_queue: sqs.IQueue | None = None,
    ) -> lambda_.Function:
        """The step's function, with the pipeline's environment (and `environment`); in the
        cluster's network when it calls the Kubernetes API."""
        variables = {**self._environment, **(environment or {})}
        if step.knows_state_machine:
            variables |= environment_for(
                PipelineSettings, state_machine_arn=self.state_machine.state_machine_arn
            )
        function = pipeline_function(
            self,
            step.id,
            handler=step.handler,
            description=step.description,
            code=self._code,
            timeout=Duration.seconds(step.timeout_seconds),
            environment=variables,
            memory_size=step.memory_mb,
            network=self._cluster_network if step.calls_kubernetes else None,
            log_key=self._data_key,
            invocation=INVOKED_BY[step.trigger],
            dead_letter_queue=dead_letter_queue,
        )
        self.functions[step.name] = function
        return function

    def add_scheduled_step(
        self, step: PipelineStep, *, every: Duration, environment: dict[str, str]
    ) -> lambda_.Function:
        """A step run on a schedule, with the settings of the plane it works on."""
        function = self._function(step, environment)
        self._on_schedule(step, function, every=every, description=step.description)
        alarm(
            self,
            errors_alarm_name(step.name),
            function.metric_errors(period=Duration.minutes(5)),
            self.alert_topic,
        )
        return function

    def _on_schedule(
        self, step: PipelineStep, function: lambda_.IFunction, *, every: Duration, description: str
    ) -> None:
        events.Rule(
            self,
            f"{step.id.removesuffix('Function')}Schedule",
            description=description,
            schedule=events.Schedule.rate(every),
            targets=[targets.LambdaFunction(function, retry_attempts=2)],
        )

    # --- the needs it provides (stacks/components/access.py) ---

    provides = frozenset(
        {
            Need.RUNS_GET,
            Need.RUNS_SCAN,
            Need.RUNS_PUT,
            Need.EXECUTION_START,
            Need.EXECUTIONS_STOP,
            Need.ALERTS_PUBLISH,
            Need.EXECUTIONS_READ,
            Need.REAPER_INVOKE,
            Need.PIPELINE_LOGS_READ,
        }
    )

    def grant(self, need: Need, role: iam.IRole) -> None:
        match need:
            case Need.RUNS_GET:
                self._table(role, "dynamodb:GetItem", writes=False)
            case Need.RUNS_SCAN:
                self._table(role, "dynamodb:Scan", writes=False)
            case Need.RUNS_PUT:
                self._table(role, "dynamodb:PutItem", writes=True)
            case Need.EXECUTION_START:
                self.state_machine.grant_start_execution(role)
            case Need.EXECUTIONS_STOP | Need.EXECUTIONS_READ:
                second = "StopExecution" if need is Need.EXECUTIONS_STOP else "GetExecutionHistory"
                role.add_to_principal_policy(
                    iam.PolicyStatement(
                        actions=["states:DescribeExecution", f"states:{second}"],
                        resources=[self._executions],
                    )
                )
                # Executions are named by run id: only this state machine's.
                acknowledge_resource(role, self._executions, Wildcard.NAMED_AT_RUN_TIME)
            case Need.REAPER_INVOKE:
                role.add_to_principal_policy(
                    iam.PolicyStatement(
                        actions=["lambda:InvokeFunction"],
                        resources=[self.functions["reap"].function_arn],
                    )
                )
            case Need.PIPELINE_LOGS_READ:
                groups = [self.execution_logs, *(f.log_group for f in self.functions.values())]
                grant_log_reading(role, *(group.log_group_arn for group in groups))
            case Need.ALERTS_PUBLISH:
                self.alert_topic.grant_publish(role)
                acknowledge_key_grant(role, ("kms:GenerateDataKey*",))

    def _table(self, role: iam.IRole, action: str, *, writes: bool) -> None:
        grant_table_action(role, action, self.runs_table, self._data_key, writes=writes)

    @property
    def log_group_names(self) -> list[str]:
        """Where the pipeline logs: its execution history and every function."""
        return [
            self.execution_logs.log_group_name,
            *(function.log_group.log_group_name for function in self.functions.values()),
        ]
