"""The training pipeline: upload rule -> start Lambda -> state machine of thin step Lambdas.

State machine (compute steps come with the backends of the compute issue):

    Validate -> Register -> Provision -> Teardown -> NotifySuccess -> Succeeded
    any step fails -> Failed in <step> -> TeardownAfterFailure -> NotifyFailure -> Fail

Every task retries Lambda's transient errors; every failure reaches teardown, then a failure
notification, then a Fail state that carries the original error and cause.
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Duration, RemovalPolicy, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from domain.backends import WAITING, Phase
from domain.bucket import TRAINING_DATA_PREFIX
from domain.run_queues import deployment_prefix
from stacks.components.access import NEEDS, Need, grant_log_reading, grant_table_key
from stacks.components.functions import ClusterNetwork, pipeline_function
from stacks.components.nag import acknowledge, acknowledge_resource
from stacks.config import PlatformConfig
from training_configs.schema import DEFAULT_CONFIG, MAX_DEADLINE_HOURS

HANDLERS = "lambdas.pipeline.handlers"
# Validation before a run's deadline starts, and release, teardown and notice after it passes.
AFTER_DEADLINE_HOURS = 2


class TrainingPipeline(Construct):
    """Attributes: `runs_table`, `alert_topic`, `state_machine`, `upload_rule`, `functions`.
    Provides the needs about runs, executions and alerts (`provides`, `grant`)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: PlatformConfig,
        code: lambda_.Code,
        data_bucket: s3.IBucket,
        data_key: kms.IKey,
        conversations: dynamodb.ITable,
        router_url: str,
        consumer: lambda_.IFunction,
        cluster_network: ClusterNetwork,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self._cluster_network = cluster_network
        self.runs_table = dynamodb.Table(
            self,
            "Runs",
            partition_key=dynamodb.Attribute(name="run_id", type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            encryption=dynamodb.TableEncryption.CUSTOMER_MANAGED,
            encryption_key=data_key,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            removal_policy=RemovalPolicy.RETAIN,
        )
        alert_key = kms.Key(
            self, "AlertKey", enable_key_rotation=True, description="Encrypts nova-mtrl alerts"
        )
        alert_key.grant_encrypt_decrypt(iam.ServicePrincipal("cloudwatch.amazonaws.com"))
        self.alert_topic = sns.Topic(
            self, "Alerts", master_key=alert_key, enforce_ssl=True, display_name="nova-mtrl"
        )
        if config.alert_email:
            self.alert_topic.add_subscription(subscriptions.EmailSubscription(config.alert_email))

        environment = {
            "NAME_PREFIX": config.name_prefix,
            "RUNS_TABLE": self.runs_table.table_name,
            "CONVERSATIONS_TABLE": conversations.table_name,
            "DEFAULT_CONFIG": DEFAULT_CONFIG,
            "DATA_KEY_ARN": data_key.key_arn,
            "ALERT_TOPIC_ARN": self.alert_topic.topic_arn,
            "ROUTER_URL": router_url,
            "CONSUMER_FUNCTION": consumer.function_name,
            "POLL_SECONDS": "60",
        }
        steps = {
            "validate": "Validates the uploaded dataset, streaming, with a line-numbered report",
            "register": "Registers the run: id, training config, cost and budget check",
            "provision": "Creates the run's queues, alarms and router entry",
            "teardown": "Deletes every per-run resource (idempotent)",
            "notify_end": "Publishes how the run ended",
        }
        compute_steps = {
            "scale_up": "Asks the training cluster for the run's nodes",
            "nodes_ready": "Counts the run's schedulable nodes",
            "start_workers": "Starts the run's reward workers with a fresh run token",
            "workers_healthy": "Counts the run's healthy reward workers",
            "submit_job": "Submits the run's training job (idempotent)",
            "monitor": "Polls the job; stops runs past their deadline or budget",
            "collect": "Lists the run's results under runs/<run_id>/",
            "release_compute": "Stops workers, deletes the job, scales nodes down (idempotent)",
        }
        self.functions = {
            name: pipeline_function(
                self,
                f"{name.title().replace('_', '')}Function",
                handler=f"{HANDLERS}.{name}",
                description=description,
                code=code,
                timeout=Duration.minutes(15 if name == "validate" else 2),
                environment=environment,
                memory_size=1024 if name == "validate" else 512,
                network=self._network(name),
            )
            for name, description in {**steps, **compute_steps}.items()
        }
        self._code, self._environment = code, environment
        self._data_key = data_key
        self.state_machine = self._state_machine(config)
        self._executions = stack.format_arn(
            service="states",
            resource="execution",
            resource_name=f"{config.name_prefix}-pipeline:*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        start = pipeline_function(
            self,
            "StartRun",
            handler=f"{HANDLERS}.start_run",
            description="Starts the pipeline for an upload, named after the run (idempotent)",
            code=code,
            timeout=Duration.seconds(30),
            environment={**environment, "STATE_MACHINE_ARN": self.state_machine.state_machine_arn},
        )
        self.functions["start_run"] = start
        self._reaper(code, environment)
        self.trigger_dlq = sqs.Queue(
            self,
            "TriggerDeadLetters",
            # SQS-managed: EventBridge cannot use the AWS managed key alias/aws/sqs to deliver
            # dead letters (EventBridge User Guide, "Using dead-letter queues").
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        acknowledge(
            self.trigger_dlq,
            "AwsSolutions-SQS3",
            "This queue is itself the dead-letter queue of the upload rule's target.",
        )
        self.upload_rule = events.Rule(
            self,
            "UploadRule",
            description="A .jsonl under training-data/ starts a training run",
            event_pattern=events.EventPattern(
                source=["aws.s3"],
                detail_type=["Object Created"],
                detail={
                    "bucket": {"name": [data_bucket.bucket_name]},
                    "object": {"key": events.Match.wildcard(f"{TRAINING_DATA_PREFIX}*.jsonl")},
                },
            ),
            targets=[
                targets.LambdaFunction(
                    start,
                    dead_letter_queue=self.trigger_dlq,
                    retry_attempts=8,
                    max_event_age=Duration.hours(2),
                )
            ],
        )
        self.add_alarms()
        self.dashboard = self._dashboard(config)

    def _dashboard(self, config: PlatformConfig) -> cloudwatch.Dashboard:
        """Runs and states at a glance, plus the age of every run queue's oldest message."""
        period = Duration.minutes(5)
        machine = self.state_machine
        queue_ages = cloudwatch.MathExpression(
            expression=(
                'SEARCH(\'{AWS/SQS,QueueName} MetricName="ApproximateAgeOfOldestMessage" '
                f"QueueName=\"{deployment_prefix(config.name_prefix)}\"', 'Maximum', 300)"
            ),
            label="oldest message age (s)",
            period=period,
        )
        dashboard = cloudwatch.Dashboard(
            self, "Dashboard", dashboard_name=f"{config.name_prefix}-pipeline"
        )
        dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Runs (executions)",
                left=[
                    machine.metric_started(period=period),
                    machine.metric_succeeded(period=period),
                    machine.metric_failed(period=period),
                    machine.metric_timed_out(period=period),
                    machine.metric_aborted(period=period),
                ],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="Step errors",
                left=[
                    function.metric_errors(period=period, label=name)
                    for name, function in self.functions.items()
                ],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="Run queues: oldest message age", left=[queue_ages], width=12
            ),
            cloudwatch.GraphWidget(
                title="Reward progress (mean reward per run)",
                left=[
                    cloudwatch.MathExpression(
                        # Trainers publish nova-mtrl/Training MeanReward with a RunId dimension.
                        expression="SEARCH('{nova-mtrl/Training,RunId} MetricName=\"MeanReward\"', 'Average', 300)",
                        label="mean reward",
                        period=period,
                    )
                ],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="Upload events dead-lettered",
                left=[
                    self.trigger_dlq.metric_approximate_number_of_messages_visible(period=period)
                ],
                width=12,
            ),
        )
        return dashboard

    def _reaper(self, code: lambda_.Code, environment: dict[str, str]) -> None:
        """Every 15 minutes: tear down runs past their deadline or whose execution ended."""
        reaper = pipeline_function(
            self,
            "Reaper",
            handler=f"{HANDLERS}.reap",
            description="Tears down runs past their deadline or whose execution is gone",
            code=code,
            timeout=Duration.minutes(5),
            environment={**environment, "STATE_MACHINE_ARN": self.state_machine.state_machine_arn},
            network=self._network("reap"),
        )
        events.Rule(
            self,
            "ReaperSchedule",
            description="Reaps overdue and orphaned training runs",
            schedule=events.Schedule.rate(Duration.minutes(15)),
            targets=[targets.LambdaFunction(reaper, retry_attempts=2)],
        )
        self.functions["reap"] = reaper

    # --- the needs it provides (stacks/components/access.py) ---

    provides = frozenset(
        {
            Need.RUNS_GET,
            Need.RUNS_SCAN,
            Need.RUNS_PUT,
            Need.CAPACITY_LEASES,
            Need.CAPACITY_LEASES_READ,
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
            case Need.CAPACITY_LEASES:
                self._table(role, "dynamodb:UpdateItem", writes=True)
            case Need.CAPACITY_LEASES_READ:
                self._table(role, "dynamodb:GetItem", writes=False)
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
                acknowledge_resource(
                    role,
                    "AwsSolutions-IAM5",
                    self._executions,
                    "Executions are named by run id at run time; only this state machine's.",
                )
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
                acknowledge(
                    role,
                    "AwsSolutions-IAM5[Action::kms:GenerateDataKey*]",
                    "From the alert topic's grant_publish: SNS encrypts each message with the "
                    "topic's key for the publisher.",
                )

    def _table(self, role: iam.IRole, action: str, *, writes: bool) -> None:
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=[action], resources=[self.runs_table.table_arn])
        )
        grant_table_key(role, self._data_key, writes=writes)

    @property
    def log_group_names(self) -> list[str]:
        """Where the pipeline logs: its execution history and every function."""
        return [
            self.execution_logs.log_group_name,
            *(function.log_group.log_group_name for function in self.functions.values()),
        ]

    def _network(self, step: str) -> ClusterNetwork | None:
        """A step that calls the Kubernetes API runs where the API's private endpoint is."""
        return self._cluster_network if Need.KUBERNETES in NEEDS[step] else None

    def add_scheduled_step(
        self, name: str, description: str, *, every: Duration, environment: dict[str, str]
    ) -> lambda_.Function:
        """A compute-plane function (lambdas/pipeline/compute.py) run on a schedule."""
        title = name.title().replace("_", "")
        function = pipeline_function(
            self,
            f"{title}Function",
            handler=f"{HANDLERS}.{name}",
            description=description,
            code=self._code,
            timeout=Duration.minutes(2),
            environment={**self._environment, **environment},
            network=self._network(name),
        )
        events.Rule(
            self,
            f"{title}Schedule",
            description=description,
            schedule=events.Schedule.rate(every),
            targets=[targets.LambdaFunction(function, retry_attempts=2)],
        )
        self.functions[name] = function
        self._alarm(f"{title}Errors", function.metric_errors(period=Duration.minutes(5)))
        return function

    def add_alarms(self) -> None:
        """Execution failed or timed out, any pipeline Lambda erroring, upload events dead-lettered."""
        metrics = {
            "ExecutionsFailed": self.state_machine.metric_failed(period=Duration.minutes(5)),
            "ExecutionsTimedOut": self.state_machine.metric_timed_out(period=Duration.minutes(5)),
            "TriggerDeadLetters": self.trigger_dlq.metric_approximate_number_of_messages_visible(
                period=Duration.minutes(5)
            ),
            **{
                f"{name.title().replace('_', '')}Errors": function.metric_errors(
                    period=Duration.minutes(5)
                )
                for name, function in self.functions.items()
            },
        }
        for name, metric in metrics.items():
            self._alarm(name, metric)

    def _alarm(self, name: str, metric: cloudwatch.IMetric) -> None:
        """An alarm to the alert topic when `metric` reaches 1 in a period."""
        alarm = metric.create_alarm(
            self,
            f"{name}Alarm",
            threshold=1,
            evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=f"nova-mtrl pipeline: {name}",
        )
        alarm.add_alarm_action(cw_actions.SnsAction(self.alert_topic))

    def _state_machine(self, config: PlatformConfig) -> sfn.StateMachine:
        def task(
            state: str, function: str, payload: dict | None, result: str
        ) -> tasks.LambdaInvoke:
            invoke = tasks.LambdaInvoke(
                self,
                state,
                lambda_function=self.functions[function],
                # None: no Parameters, so the function gets the whole state (upload, run, resources).
                payload=sfn.TaskInput.from_object(payload) if payload is not None else None,
                payload_response_only=True,
                result_path=result,
                retry_on_service_exceptions=True,
            )
            # Throttling is transient too: back off and try again.
            invoke.add_retry(
                errors=["Lambda.TooManyRequestsException"],
                interval=Duration.seconds(2),
                max_attempts=8,
                backoff_rate=2,
            )
            return invoke

        run_id = {"run_id.$": "$.run.run_id"}
        release_after_failure = task(
            "ReleaseComputeAfterFailure", "release_compute", None, "$.released"
        )
        release_after_failure.add_retry(
            errors=["States.ALL"], max_attempts=4, backoff_rate=2, interval=Duration.seconds(5)
        )
        teardown_after_failure = task(
            "TeardownAfterFailure", "teardown", {"run_id.$": "$.failure.run_id"}, "$.teardown"
        )
        teardown_after_failure.add_retry(
            errors=["States.ALL"], max_attempts=4, backoff_rate=2, interval=Duration.seconds(5)
        )
        notify_failure = task(
            "NotifyFailure",
            "notify_end",
            {
                "run_id.$": "$.failure.run_id",
                "succeeded": False,
                "failed_state.$": "$.failure.state",
                "error.$": "$.error.Cause",
                "teardown.$": "$.teardown",
            },
            "$.notification",
        )
        failed = sfn.Fail(self, "RunFailed", error_path="$.error.Error", cause_path="$.error.Cause")
        # A failed notification must not replace the run's own error.
        notify_failure.add_catch(failed, errors=["States.ALL"], result_path="$.notification_error")
        release_after_failure.add_catch(
            teardown_after_failure, errors=["States.ALL"], result_path="$.release_error"
        )
        failure = release_after_failure.next(
            teardown_after_failure.next(notify_failure.next(failed))
        )

        def caught(step: tasks.LambdaInvoke, run_id_path: str) -> tasks.LambdaInvoke:
            marker = sfn.Pass(
                self,
                f"FailedIn{step.id}",
                parameters={"state": step.id, "run_id.$": run_id_path},
                result_path="$.failure",
            )
            marker.next(failure)
            step.add_catch(marker, errors=["States.ALL"], result_path="$.error")
            return step

        def compute(name: str, function: str, result: str) -> tasks.LambdaInvoke:
            return caught(task(name, function, None, result), "$.run.run_id")

        def poll_until(
            name: str, check: tasks.LambdaInvoke, result: str, ready: sfn.IChainable
        ) -> sfn.Wait:
            wait = sfn.Wait(
                self, f"WaitFor{name}", time=sfn.WaitTime.seconds_path("$.run.poll_seconds")
            )
            wait.next(check).next(
                sfn.Choice(self, f"{name}Ready?")
                .when(sfn.Condition.boolean_equals(f"{result}.ready", True), ready)
                .otherwise(wait)
            )
            return wait

        validate = caught(
            task("Validate", "validate", {"upload.$": "$"}, "$.validation"), "$$.Execution.Name"
        )
        register = caught(
            task("Register", "register", {"upload.$": "$"}, "$.run"), "$$.Execution.Name"
        )
        provision = caught(task("Provision", "provision", run_id, "$.resources"), "$.run.run_id")
        teardown = task("Teardown", "teardown", run_id, "$.teardown")
        teardown.add_retry(
            errors=["States.ALL"], max_attempts=4, backoff_rate=2, interval=Duration.seconds(5)
        )
        caught(teardown, "$.run.run_id")
        notify = caught(
            task(
                "NotifySuccess",
                "notify_end",
                {**run_id, "succeeded": True, "teardown.$": "$.teardown"},
                "$.notification",
            ),
            "$.run.run_id",
        )
        release = compute("ReleaseCompute", "release_compute", "$.released")
        release.add_retry(
            errors=["States.ALL"], max_attempts=4, backoff_rate=2, interval=Duration.seconds(5)
        )
        finish = (
            compute("Collect", "collect", "$.results")
            .next(release)
            .next(teardown)
            .next(notify)
            .next(sfn.Succeed(self, "RunSucceeded"))
        )
        job_failed = (
            sfn.Pass(
                self,
                "JobDidNotSucceed",
                parameters={
                    "Error": "TrainingJobFailed",
                    "Cause.$": "States.Format('{}: {}', $.job.phase, $.job.reason)",
                },
                result_path="$.error",
            )
            .next(
                sfn.Pass(
                    self,
                    "FailedInTrainingJob",
                    parameters={"state": "TrainingJob", "run_id.$": "$.run.run_id"},
                    result_path="$.failure",
                )
            )
            .next(failure)
        )
        monitor = compute("Monitor", "monitor", "$.job")
        job_wait = sfn.Wait(
            self, "WaitForJob", time=sfn.WaitTime.seconds_path("$.run.poll_seconds")
        )
        job_wait.next(monitor).next(
            sfn.Choice(self, "JobDone?")
            .when(sfn.Condition.string_equals("$.job.phase", Phase.SUCCEEDED), finish)
            .when(
                sfn.Condition.or_(
                    *(sfn.Condition.string_equals("$.job.phase", p) for p in WAITING)
                ),
                job_wait,
            )
            .otherwise(job_failed)
        )
        submit = compute("SubmitJob", "submit_job", "$.submitted").next(job_wait)
        workers = compute("StartWorkers", "start_workers", "$.workers").next(
            poll_until(
                "Workers",
                compute("WorkersHealthy", "workers_healthy", "$.fleet"),
                "$.fleet",
                submit,
            )
        )
        nodes = compute("ScaleUp", "scale_up", "$.scaled").next(
            poll_until("Nodes", compute("NodesReady", "nodes_ready", "$.nodes"), "$.nodes", workers)
        )
        definition = validate.next(register).next(provision).next(nodes)
        log_group = logs.LogGroup(
            self,
            "ExecutionLogs",
            retention=logs.RetentionDays.SIX_MONTHS,
            removal_policy=RemovalPolicy.DESTROY,
        )
        self.execution_logs = log_group
        machine = sfn.StateMachine(
            self,
            "StateMachine",
            state_machine_name=f"{config.name_prefix}-pipeline",
            definition_body=sfn.DefinitionBody.from_chainable(definition),
            # Each run's deadline is enforced by the pipeline itself (Monitor, the waits, the
            # reaper), which then releases, tears down and notifies; the execution's own limit
            # is only a backstop and must outlast the longest deadline a config may set.
            timeout=Duration.hours(MAX_DEADLINE_HOURS + AFTER_DEADLINE_HOURS),
            tracing_enabled=True,
            logs=sfn.LogOptions(
                destination=log_group, level=sfn.LogLevel.ALL, include_execution_data=True
            ),
        )
        for function in self.functions.values():
            acknowledge_resource(
                machine.role,
                "AwsSolutions-IAM5",
                f"{function.function_arn}:*",
                "Step Functions invokes any published version of the pipeline's own functions.",
            )
        acknowledge(
            machine.role,
            "AwsSolutions-IAM5[Resource::*]",
            "Logs delivery and X-Ray actions of Step Functions have no resource-level permissions.",
        )
        return machine
