"""The pipeline functions' settings: one typed model over their environment (set by the stack)."""

from __future__ import annotations

from pydantic import Field, Json

from domain.presets import ModelPreset
from domain.run_queues import PURGE_SECONDS
from domain.runs import execution_arn
from lambdas.clients import Clients
from lambdas.environment import EnvironmentSettings
from lambdas.pipeline.resources import RouterWiring
from lambdas.router.conversations import ConversationStore
from training_configs.schema import DEFAULT_CONFIG


class PipelineSettings(EnvironmentSettings):
    """From the functions' environment (set by the pipeline stack)."""

    name_prefix: str = Field(alias="NAME_PREFIX")
    runs_table: str = Field(alias="RUNS_TABLE")
    conversations_table: str = Field(alias="CONVERSATIONS_TABLE")
    consumer_function: str = Field(alias="CONSUMER_FUNCTION")
    rollout_lambda_arn: str = Field(alias="ROLLOUT_LAMBDA_ARN")
    default_config: str = Field(default=DEFAULT_CONFIG, alias="DEFAULT_CONFIG")
    state_machine_arn: str | None = Field(default=None, alias="STATE_MACHINE_ARN")
    data_key_arn: str | None = Field(default=None, alias="DATA_KEY_ARN")
    alert_topic_arn: str | None = Field(default=None, alias="ALERT_TOPIC_ARN")
    router_url: str | None = Field(default=None, alias="ROUTER_URL")
    poll_seconds: int = Field(default=60, ge=0, alias="POLL_SECONDS")
    # How long a phase's job waits after its queues were purged (local mode: moto purges at once).
    purge_seconds: int = Field(default=PURGE_SECONDS, ge=0, alias="PURGE_SECONDS")
    # The model registry group Collect registers each trained model in (unset: none).
    model_package_group: str | None = Field(default=None, alias="MODEL_PACKAGE_GROUP")
    # What the training cluster offers (its presets and GPU type), to refuse a config it cannot
    # run before any resource exists; unset, registration does not check. The stack sets them
    # from the same values as the cluster's own settings (hyperpod_training.HyperPodSettings).
    model_presets: Json[dict[str, ModelPreset]] | None = Field(default=None, alias="MODEL_PRESETS")
    training_instance_type: str | None = Field(default=None, alias="HYPERPOD_INSTANCE_TYPE")
    # The restricted group's, where the deployment has one (lambdas/pipeline/nova_training.py).
    nova_instance_type: str | None = Field(default=None, alias="NOVA_INSTANCE_TYPE")
    # The managed job's role, where the deployment has the serverless plane
    # (lambdas/pipeline/serverless_training.py).
    serverless_job_role_arn: str | None = Field(default=None, alias="SERVERLESS_JOB_ROLE_ARN")
    # The deployment's managed MLflow tracking server, where it has one: each run is an MLflow
    # run there (lambdas/pipeline/experiment_tracking.py); the endpoint is the region's unless
    # set (tests).
    mlflow_tracking_server_arn: str | None = Field(default=None, alias="MLFLOW_TRACKING_SERVER_ARN")
    mlflow_endpoint: str | None = Field(default=None, alias="MLFLOW_ENDPOINT")

    def router_wiring(self, clients: Clients) -> RouterWiring:
        """The run resources' clients and names."""
        return RouterWiring(
            sqs=clients("sqs"),
            cloudwatch=clients("cloudwatch"),
            lambda_client=clients("lambda"),
            consumer_function=self.consumer_function,
            rollout_lambda_arn=self.rollout_lambda_arn,
            prefix=self.name_prefix,
            conversations=ConversationStore(clients("dynamodb"), self.conversations_table),
        )

    def execution_arn(self, run_id: str) -> str:
        """The ARN of the run's execution (executions are named by run id)."""
        if not self.state_machine_arn:
            raise ValueError("STATE_MACHINE_ARN is not set for this function")
        return execution_arn(self.state_machine_arn, run_id)
