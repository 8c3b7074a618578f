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

from domain.health import TRAINING_FIGURES, TRAINING_METRICS_NAMESPACE, TRAINING_METRICS_SERVICE
from domain.naming import run_prefix

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
            f"QueueName=\"{run_prefix(name_prefix)}\"', 'Maximum', 300)"
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
        *training_widgets(name_prefix),
        cloudwatch.GraphWidget(
            title="Upload events dead-lettered",
            left=[trigger_dlq.metric_approximate_number_of_messages_visible(period=PERIOD)],
            width=12,
        ),
    )
    return dashboard


# What Monitor publishes a run's steps under (lambdas/pipeline/training_metrics.py).
TRAINING_DIMENSIONS = ("deployment", "run_id", "service")
# Shares of a step's groups or rollouts (and the reward-hacking rise) on one axis; turns and the
# reward's spread on another.
OWN_AXIS = ("MeanTurns", "RewardSpread")
HEALTH_FIGURES = tuple(
    name for name in TRAINING_FIGURES if name not in ("MeanReward", "SuccessRate", *OWN_AXIS)
)


def per_run(name_prefix: str, figure: str) -> cloudwatch.MathExpression:
    """`figure` of every run of the deployment, a line per run."""
    schema = ",".join((TRAINING_METRICS_NAMESPACE, *TRAINING_DIMENSIONS))
    return cloudwatch.MathExpression(
        expression=(
            f'SEARCH(\'{{{schema}}} MetricName="{figure}" deployment="{name_prefix}" '
            f"service=\"{TRAINING_METRICS_SERVICE}\"', 'Average', 300)"
        ),
        label=figure,
        period=PERIOD,
    )


def training_widgets(name_prefix: str) -> list[cloudwatch.GraphWidget]:
    """Each run's training steps as Monitor saw them: reward, successes and run health."""
    return [
        cloudwatch.GraphWidget(
            title="Mean reward per run (by training step)",
            left=[per_run(name_prefix, "MeanReward")],
            width=12,
        ),
        cloudwatch.GraphWidget(
            title="Success rate per run (the environment's success flag)",
            left=[per_run(name_prefix, "SuccessRate")],
            width=12,
        ),
        cloudwatch.GraphWidget(
            title="Run health per run (shares of a step's groups or rollouts; reward hacking: "
            "a rise in reward)",
            left=[per_run(name_prefix, figure) for figure in HEALTH_FIGURES],
            width=12,
        ),
        cloudwatch.GraphWidget(
            title="Turns per episode and reward spread per run",
            left=[per_run(name_prefix, "MeanTurns")],
            right=[per_run(name_prefix, "RewardSpread")],
            width=12,
        ),
    ]
