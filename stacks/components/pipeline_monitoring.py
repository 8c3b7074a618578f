"""What the pipeline shows and tells: its dashboard, and alarms to the alert topic."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from domain.run_queues import deployment_prefix

PERIOD = Duration.minutes(5)


def alarm(scope: Construct, name: str, metric: cloudwatch.IMetric, topic: sns.ITopic) -> None:
    """An alarm to `topic` when `metric` reaches 1 in a period."""
    created = metric.create_alarm(
        scope,
        f"{name}Alarm",
        threshold=1,
        evaluation_periods=1,
        comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        alarm_description=f"nova-mtrl pipeline: {name}",
    )
    created.add_alarm_action(cw_actions.SnsAction(topic))


def errors_alarm_name(step: str) -> str:
    return f"{step.title().replace('_', '')}Errors"


def pipeline_alarms(
    scope: Construct,
    *,
    machine: sfn.StateMachine,
    functions: Mapping[str, lambda_.IFunction],
    trigger_dlq: sqs.IQueue,
    topic: sns.ITopic,
) -> None:
    """Execution failed or timed out, any pipeline Lambda erroring, upload events dead-lettered."""
    metrics = {
        "ExecutionsFailed": machine.metric_failed(period=PERIOD),
        "ExecutionsTimedOut": machine.metric_timed_out(period=PERIOD),
        "TriggerDeadLetters": trigger_dlq.metric_approximate_number_of_messages_visible(
            period=PERIOD
        ),
        **{
            errors_alarm_name(name): function.metric_errors(period=PERIOD)
            for name, function in functions.items()
        },
    }
    for name, metric in metrics.items():
        alarm(scope, name, metric, topic)


def pipeline_dashboard(
    scope: Construct,
    *,
    name_prefix: str,
    machine: sfn.StateMachine,
    functions: Mapping[str, lambda_.IFunction],
    trigger_dlq: sqs.IQueue,
) -> cloudwatch.Dashboard:
    """Runs and states at a glance, plus the age of every run queue's oldest message."""
    queue_ages = cloudwatch.MathExpression(
        expression=(
            'SEARCH(\'{AWS/SQS,QueueName} MetricName="ApproximateAgeOfOldestMessage" '
            f"QueueName=\"{deployment_prefix(name_prefix)}\"', 'Maximum', 300)"
        ),
        label="oldest message age (s)",
        period=PERIOD,
    )
    dashboard = cloudwatch.Dashboard(scope, "Dashboard", dashboard_name=f"{name_prefix}-pipeline")
    dashboard.add_widgets(
        cloudwatch.GraphWidget(
            title="Runs (executions)",
            left=[
                machine.metric_started(period=PERIOD),
                machine.metric_succeeded(period=PERIOD),
                machine.metric_failed(period=PERIOD),
                machine.metric_timed_out(period=PERIOD),
                machine.metric_aborted(period=PERIOD),
            ],
            width=12,
        ),
        cloudwatch.GraphWidget(
            title="Step errors",
            left=[
                function.metric_errors(period=PERIOD, label=name)
                for name, function in functions.items()
            ],
            width=12,
        ),
        cloudwatch.GraphWidget(title="Run queues: oldest message age", left=[queue_ages], width=12),
        cloudwatch.GraphWidget(
            title="Reward progress (mean reward per run)",
            left=[
                cloudwatch.MathExpression(
                    # Trainers publish nova-mtrl/Training MeanReward with a RunId dimension.
                    expression="SEARCH('{nova-mtrl/Training,RunId} MetricName=\"MeanReward\"', 'Average', 300)",
                    label="mean reward",
                    period=PERIOD,
                )
            ],
            width=12,
        ),
        cloudwatch.GraphWidget(
            title="Upload events dead-lettered",
            left=[trigger_dlq.metric_approximate_number_of_messages_visible(period=PERIOD)],
            width=12,
        ),
    )
    return dashboard
