"""What a function or workload of the platform may need to do in AWS: one name per need. The
step table (lambdas/pipeline/steps.py) and the workloads name what they need; the constructs
owning the resources turn needs into IAM statements (stacks/components/access.py) — so the
names live here, below both."""

from __future__ import annotations

from enum import StrEnum


class Need(StrEnum):
    # The data bucket (datasets, configs, a run's outputs).
    DATASETS_READ = "read the dataset version a run started with"
    DATASETS_READ_CURRENT = "read datasets as they are now"
    EVALUATION_DATA_READ = "read a config's evaluation file (evaluation-data/)"
    CONFIGS_READ = "read configs"
    OUTPUTS_LIST = "list a run's outputs"
    OUTPUTS_READ = "read a run's outputs"
    OUTPUTS_WRITE = "write a run's outputs"
    EXPERIMENTS_LOG = "log a run to the deployment's MLflow tracking server (when it has one)"
    TRAJECTORIES_WRITE = "write a run's trajectories (trajectories/<run_id>/)"
    TRAJECTORIES_READ = "list and read runs' trajectories (trajectories/<run_id>/)"
    CHECKPOINTS_READ = "list and read a run's checkpoints (runs/<run_id>/checkpoints/)"
    CHECKPOINTS_PRUNE = "delete a run's older checkpoints"
    # The runs table and the capacity leases in it.
    RUNS_GET = "read a run"
    RUNS_SCAN = "list the runs"
    RUNS_PUT = "store a run"
    CAPACITY_LEASES = "take and return GPU capacity leases"
    CAPACITY_LEASES_READ = "read who holds GPU capacity, since when idle"
    # The pipeline itself.
    EXECUTION_START = "start an execution"
    EXECUTIONS_STOP = "describe and stop executions"
    ALERTS_PUBLISH = "publish to the alert topic"
    # The router: conversations, run queues, their alarms, the consumer's mappings.
    CONVERSATIONS_GET = "read a conversation record"
    CONVERSATIONS_QUERY = "read a run's rollout reports"
    CONVERSATIONS_PUT = "store a new conversation record"
    CONVERSATIONS_UPDATE = "change a conversation record"
    CONVERSATIONS_DELETE = "delete a run's registration with the router"
    RUN_QUEUES_CREATE = "create a run's queues"
    RUN_QUEUES_DELETE = "delete a run's queues"
    RUN_QUEUES_PURGE = "empty a run's queues between its phases"
    RUN_QUEUES_SEND = "send to run queues"
    RUN_QUEUES_RECEIVE = "receive from run queues"
    RUN_QUEUES_POLL = "let Lambda poll run queues for the consumer"
    QUEUE_ALARMS_CREATE = "create a run's queue alarms"
    QUEUE_ALARMS_DELETE = "delete a run's queue alarms"
    CONSUMER_CONNECT = "connect a run's queue to the consumer"
    CONSUMER_DISCONNECT = "disconnect a run's queue from the consumer"
    PROXY_INVOKE = "call the proxy's function URL"
    ROLLOUT_REQUESTS_FORWARD = "put rollout requests on a run's queue"
    ROLLOUT_LAMBDA_INVOKE = "invoke the deployment's rollout Lambda (the forwarder, unqualified)"
    # The reward fleet (ECS).
    FLEET_START = "start a run's reward workers"
    FLEET_WATCH = "count a run's reward workers"
    FLEET_STOP = "stop a run's reward workers"
    # The training plane (HyperPod, EKS).
    NODES_SCALE = "scale the training instance group"
    NODES_COUNT = "count the training group's nodes"
    KUBERNETES = "use the EKS cluster's Kubernetes API"
    POD_IDENTITY_CREATE = "give a run's pods the job role"
    POD_IDENTITY_DELETE = "take the job role from a run's pods"
    HUB_TOKENS_READ = "read the Hugging Face tokens the model presets name (gated models)"
    # The Nova plane (a restricted instance group, AWS's launcher).
    NOVA_LAUNCH = "start and stop a run's Nova job through the launcher function"
    FORGE_RECIPES_READ = "read the Nova Forge BYOO recipes"
    NOVA_CHART = (
        "install and uninstall AWS's Nova chart in the kubeflow namespace (with the HyperPod "
        "CLI's cluster context)"
    )
    # The serverless plane (SageMaker's managed multi-turn RL job, a deployment's agent Lambda).
    MANAGED_JOB_START = (
        "start a run's managed multi-turn RL job (CreateJob) with its base model and the job role"
    )
    MANAGED_JOB_WATCH = "describe a run's managed job"
    MANAGED_EVALUATION_START = (
        "start a run's held-out evaluation job (CreateJob, AgentRFTEvaluation) of its base model "
        "or of the package its training job registered, with the job role"
    )
    MANAGED_EVALUATION_WATCH = "describe a run's held-out evaluation job"
    MANAGED_JOB_STOP = "stop a run's managed jobs, training or evaluating"
    JOB_RUNTIME = "sample a managed job's policy and report its rollouts (SageMaker's job runtime)"
    AGENT_INVOKE = "invoke the deployment's agent Lambda (a managed job's rollout requests)"
    MANAGED_JOB_SERVICE = (
        "what a managed job does as the job role beside its data: describe its base model, "
        "register its checkpoints and trained model, write its logs"
    )
    # The operator running `mtrl` (submit, runs, status, cost, logs, teardown, doctor).
    DEPLOYMENT_READ = "find the deployment from its stacks' outputs"
    DATASETS_UPLOAD = "upload datasets"
    CONFIGS_UPLOAD = "upload configs"
    EXECUTIONS_READ = "read executions and their history"
    REAPER_INVOKE = "ask the reaper to tear a run down"
    PIPELINE_LOGS_READ = "read the pipeline's logs"
    QUEUES_WATCH = "read run queues' depths and ages"
    WORKER_LOGS_READ = "read the reward workers' logs"
    WORKER_IMAGE_CHECK = "check the reward worker's image"
    TRAINER_LOGS_READ = "read the training pods' logs"
    CLUSTERS_CHECK = "check the EKS and HyperPod clusters and the GPU quota"
    # Where trained models go (stacks/components/model_release.py).
    MODELS_REGISTER = "register a run's trained model in the deployment's model registry"
    MODELS_RELEASE = "deploy a registered model (Bedrock, a SageMaker endpoint)"
