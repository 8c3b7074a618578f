"""Done-when of the compute backends: the synthesized state machine, executed by moto's
interpreter on the deployed backends ("aws", made by each function from its environment) — the
ECS reward fleet on moto ECS (a Fargate stand-in reports the wanted tasks running), the HyperPod
training cluster through the SageMaker and EKS fakes and a Kubernetes API whose operator and
kubelet are scripted — submits the job, scales the fleet, sees the job finish, and tears down
every object, service and instance it created; a job that cannot pull its image fails the run
with that reason, torn down the same."""

from __future__ import annotations

import json

from domain.episodes import EvaluationStage
from domain.evaluation import EvaluationReport
from domain.naming import run_namespace
from domain.nova_job import evaluation_run_recipe, run_name, run_recipe
from domain.serverless_job import job_name
from mtrl.local.physical import ACCOUNT, REGION
from stacks.components.router import FORWARDER_HANDLER
from tests.chart_rendering import rendering
from tests.iam.conftest import ON_ONE_WORKER, Scenario, Scenarios
from tests.launcher.fake_cli import PYTORCH_JOBS

pytestmark = ON_ONE_WORKER

PREFIX = "nova-mtrl"


def _released(scenarios: Scenarios, run: Scenario) -> None:
    """Nothing of the run is left: GPU nodes back to zero, namespace and association gone,
    its ECS service, task definitions and token, its queues."""
    world = scenarios.world
    counts = [u["InstanceGroups"][0]["InstanceCount"] for u in world.sagemaker.updates[run.updates]]
    assert counts == [1, 0]  # up to the config's one node for the run, back to zero after it
    namespace = run_namespace(PREFIX, run.run_id)
    assert not any(items for path, items in world.kubernetes.objects.items() if namespace in path)
    assert namespace not in world.kubernetes.objects["/api/v1/namespaces"]
    assert not [a for a in world.eks.associations.values() if a["namespace"] == namespace]
    calls = world.recorder.calls[run.calls]
    (created,) = [c.params for c in calls if c.operation == "CreateService"]
    assert created["desiredCount"] == 4
    assert run.left == {"active services": 0, "task definitions": 0, "parameters": 0, "queues": []}


def test_a_run_on_the_aws_backends_submits_scales_finishes_and_leaves_nothing(
    scenarios: Scenarios,
) -> None:
    run = scenarios.runs["succeeds"]
    assert run.described["status"] == "SUCCEEDED", run.described
    world = scenarios.world
    requests = world.kubernetes.requests[run.kubernetes]
    namespace = run_namespace(PREFIX, run.run_id)
    # Nodes counted ready only once Kubernetes could schedule on them.
    assert any(path.startswith("/api/v1/nodes?") for _, path, _ in requests)
    # The job: every object applied in the run's namespace, read until complete, then deleted.
    applied = [path.split("?")[0] for method, path, _ in requests if method == "PATCH"]
    assert applied[0] == f"/api/v1/namespaces/{namespace}"
    # The trainer image's jobs: the baseline evaluation, training, the final evaluation.
    jobs = [path.rsplit("/", 1)[1] for path in applied if "/hyperpodpytorchjobs/" in path]
    assert jobs == ["evaluation-baseline", "trainer", "evaluation-final"]
    assert ("DELETE", f"/api/v1/namespaces/{namespace}") in [
        (m, p.split("?")[0]) for m, p, _ in requests
    ]
    calls = world.recorder.calls[run.calls]
    assert [c.operation for c in calls].count("CreatePodIdentityAssociation") == 1
    assert [c.operation for c in calls].count("DeleteService") == 1
    _released(scenarios, run)
    output = json.loads(run.described["output"])
    # The monitor read the trainer's metrics (written with its pods' role) for its last step,
    # and its health: an environment error in each step's rollouts, the default warning, kept on
    # the run's record, alerted once as Monitor's own role, and in the end notification.
    assert output["job"]["step"] == 3
    (warning,) = output["job"]["health"]
    assert "12% of the rollouts ended in an environment error on steps 1-3" in warning
    alerts = [c for c in calls if c.operation == "Publish" and "MonitorFunction" in c.principal]
    assert len(alerts) == 1 and warning in alerts[0].params["Message"]
    assert output["notification"]["health"] == [warning]
    # Its config let workers scale on the backlog; ReleaseCompute took the scaling away too.
    assert [c.operation for c in calls].count("PutScalingPolicy") == 1
    assert [c.operation for c in calls].count("DeregisterScalableTarget") == 1
    assert output["teardown"]["leftover"] == 0
    # Namespace, association, service account, and per job its settings and itself.
    assert (
        output["released"]["job_objects_deleted"] == 3 + 2 * 3
        and output["released"]["workers_stopped"] >= 1
    )
    # Each evaluation's episodes, written by the trainer image with its pods' role, were read:
    # the held-out pass rate before and after is the run's.
    assert run.evaluation is not None
    figures = [run.evaluation[stage]["mean_reward"] for stage in EvaluationStage]
    assert figures == [0.2, 0.6] and all(run.evaluation[s]["n"] == 2 for s in EvaluationStage)


def test_a_nova_run_trains_on_from_the_checkpoint_of_the_run_its_config_names(
    scenarios: Scenarios,
) -> None:
    """Register read the named run's summary (as its own role) and the launcher got a recipe
    whose model path is that run's checkpoint in AWS's escrow bucket."""
    first, run = scenarios.runs["nova succeeds"], scenarios.runs["nova trains on"]
    assert run.described["status"] == "SUCCEEDED", run.described
    (checkpoint,) = first.summary["checkpoints"]
    registered = json.loads(run.described["output"])["run"]
    assert registered["base"] == {"uri": checkpoint["uri"], "run_id": first.run_id, "step": None}
    name = run_name(PREFIX, run.run_id)
    (recipe,) = [r for r in scenarios.world.launcher.recipes_read if r["run"]["name"] == name]
    assert recipe["run"]["model_name_or_path"] == checkpoint["uri"]


def test_a_nova_run_is_started_and_stopped_by_aws_launcher_and_leaves_nothing(
    scenarios: Scenarios,
) -> None:
    """On the restricted group: the launcher function received this run's recipe (its BYOO
    endpoints are the run's queues and the deployment's rollout Lambda) and the HyperPod CLI
    invocation the Nova Forge SDK makes; the monitor followed the chart's PyTorchJob; the
    teardown uninstalled the release and scaled the restricted group back to zero."""
    run = scenarios.runs["nova succeeds"]
    assert run.described["status"] == "SUCCEEDED", run.described
    world = scenarios.world
    output = json.loads(run.described["output"])
    resources, name = output["resources"], run_name(PREFIX, run.run_id)
    (recipe,) = [r for r in world.launcher.recipes_read if r["run"]["name"] == name]
    assert recipe["run"]["rollout_request_arn"] == resources["rollout_request_arn"]
    # The forwarder itself, unqualified, as the Forge SDK passes its stack's function.
    forwarder = world.function(FORWARDER_HANDLER)
    assert (
        resources["rollout_request_arn"]
        == f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{forwarder}"
    )
    assert {recipe["run"][f"{kind}_sqs_url"] for kind in ("generate_request", "generate_response",
            "rollout_response")} == {resources["queues"][f"{kind}s"] for kind in (
            "generate_request", "generate_response", "rollout_response")}  # fmt: skip
    # Each evaluation's recipe (AWS's has the MLflow keys) logs to the deployment's server; the
    # Forge training recipe's stand-in has none, and gets none.
    for stage in EvaluationStage:
        (evaluation,) = [r for r in world.launcher.recipes_read if r["run"]["name"] == run_name(PREFIX, run.run_id, stage)]  # fmt: skip
        assert evaluation["run"]["mlflow_tracking_uri"] == world.mlflow.arn
        assert evaluation["run"]["mlflow_run_name"] == f"{run.run_id}-{stage}"
    assert "mlflow_tracking_uri" not in recipe["run"]
    recipes = [c.argv[5] for c in world.launcher.started() if name in c.argv[5]]
    evaluations = [run_name(PREFIX, run.run_id, stage) for stage in EvaluationStage]
    assert recipes == [
        evaluation_run_recipe(evaluations[0]), run_recipe("RFT_MULTITURN_LORA", name),
        evaluation_run_recipe(evaluations[1]),
    ]  # fmt: skip
    assert not [release for release in world.launcher.releases if release.startswith(name)]
    assert not world.kubernetes.objects.get(PYTORCH_JOBS)
    requests = world.kubernetes.requests[run.kubernetes]
    assert ("GET", PYTORCH_JOBS) in [(m, p.split("?")[0]) for m, p, _ in requests]
    updates = world.sagemaker.updates[run.updates]
    assert [u["RestrictedInstanceGroups"][0]["InstanceCount"] for u in updates] == [8, 0]
    assert not [u for u in updates if "InstanceGroups" in u]  # the standard group untouched
    assert output["released"]["job_objects_deleted"] == 3  # training's and both evaluations'
    assert output["teardown"]["leftover"] == 0
    assert run.left == {"active services": 0, "task definitions": 0, "parameters": 0, "queues": []}
    # Collect found the checkpoints the job recorded (its manifest, written as its role).
    ((checkpoint,),) = [run.summary["checkpoints"]]
    assert checkpoint["name"].startswith(f"{name}-")
    assert checkpoint["uri"] == f"s3://customer-escrow/{checkpoint['name']}"
    # ...and registered it in the model registry, as its own role.
    (registered,) = [
        c for c in scenarios.world.recorder.calls[run.calls] if c.operation == "CreateModelPackage"
    ]
    assert "CollectFunction" in registered.principal
    assert registered.params["CustomerMetadataProperties"]["mtrl:checkpoint"] == checkpoint["uri"]
    assert registered.response["ModelPackageArn"] == run.summary["model_package"]
    # Its planes exchanged rollouts; the monitor made the run's reward curve from the reports
    # the proxy accepted — the job ended before a step's window (64 rollouts) filled, so one
    # short window — and stepped on it.
    assert scenarios.nova_rollouts[run.run_id]["completed"] == 2
    (line,) = run.metrics
    assert (line["step"], line["rollouts"], line["failed_rollouts"]) == (1, 2, 0)
    assert (line["partial"], line["pass_rate"]) == (True, 1.0)  # both found CRANE
    assert line["mean_reward"] == line["min_reward"] == line["max_reward"] > 0
    assert output["job"]["step"] == 1
    assert "metrics.jsonl" in run.summary["outputs"]
    # Before and after, AWS's evaluation of the held-out record (w0; the job trained on the
    # others) played its rollout through its own alias: its episode, not the curve's.
    assert recipe["run"]["data_s3_path"].endswith(f"/runs/{run.run_id}/data/training.jsonl")
    assert [record["id"] for record in run.trained_on] == ["w1", "w2"]
    played = scenarios.nova_evaluations[run.run_id]
    assert {stage: p["completed"] for stage, p in played.items()} == {"baseline": 1, "final": 1}
    assert run.evaluation is not None
    for stage in EvaluationStage:
        assert (run.evaluation[stage]["n"], run.evaluation[stage]["pass_at_1"]) == (1, 1.0)
    headline = EvaluationReport.model_validate(run.summary["evaluation"]).headline()
    assert headline is not None and headline.startswith("pass@1 1.00 → 1.00 (+0.00")
    assert [n for n in scenarios.notifications if headline in n and run.run_id in n]


def test_a_nova_jobs_planes_work_with_its_own_identity_and_leave_nothing(
    scenarios: Scenarios,
) -> None:
    """The Nova trainer (the restricted group's execution role) read its dataset, asked for
    rollouts through the run's rollout Lambda and the queue, and answered generate requests; a
    reward worker played them through the proxy; `mtrl teardown` uninstalled its release."""
    run = scenarios.runs["nova held"]
    assert run.described["status"] == "ABORTED"
    assert scenarios.nova_exchange == {
        "completed": 2,
        "trajectories": 2,
        "responses": 2,
        "turns": 6,
        "dead-lettered": 1,
    }
    calls = scenarios.world.recorder.calls[run.calls]
    trainer = {(c.service, c.operation) for c in calls if "RestrictedExecutionRole" in c.principal}
    assert {("s3", "GetObject"), ("lambda", "Invoke"), ("sqs", "SendMessage"),
            ("sqs", "ReceiveMessage"), ("sqs", "DeleteMessage")} <= trainer  # fmt: skip
    ((reaped,),) = [scenarios.nova_reaped["reaped"]]
    # Its training job and its baseline evaluation (the final one never came).
    assert reaped["run_id"] == run.run_id and reaped["job_objects_deleted"] == 2
    name = run_name(PREFIX, run.run_id)
    assert not [r for r in scenarios.world.launcher.releases if r.startswith(name)]
    updates = scenarios.world.sagemaker.updates[run.updates]
    assert [u["RestrictedInstanceGroups"][0]["InstanceCount"] for u in updates] == [8, 0]
    assert run.left == {"active services": 0, "task definitions": 0, "parameters": 0, "queues": []}


def test_a_job_that_cannot_start_fails_the_run_with_the_reason_and_leaves_nothing(
    scenarios: Scenarios,
) -> None:
    run = scenarios.runs["job cannot start"]
    # The image's first job is the baseline evaluation: it cannot start, and the run fails.
    assert run.described["status"] == "FAILED" and run.described["error"] == "EvaluationFailed"
    reason = (
        "the baseline evaluation ended failed: image pull failed for trainer:missing "
        "(pod evaluation-baseline-0, container pytorch): not found"
    )
    assert reason in run.described["cause"]
    _released(scenarios, run)


def test_an_invalid_dataset_creates_nothing(scenarios: Scenarios) -> None:
    run = scenarios.runs["invalid dataset"]
    assert run.described["status"] == "FAILED" and run.described["error"] == "DatasetInvalid"
    assert not [
        c for c in scenarios.world.recorder.calls[run.calls] if c.operation.startswith("Create")
    ]


def test_each_run_is_notified_once(scenarios: Scenarios) -> None:
    """Once at its end; a run whose health warned (its trainer's steps each had an environment
    error) was alerted once more, while it went on, and only once."""
    alerts = [n for n in scenarios.notifications if " goes on, but:" in n]
    alerted = [alert.split(" ")[2] for alert in alerts]
    assert scenarios.runs["succeeds"].run_id in alerted and len(set(alerted)) == len(alerted)
    notices = [n for n in scenarios.notifications if n not in alerts]
    for name, status in (
        ("succeeds", "SUCCEEDED"),
        ("nova succeeds", "SUCCEEDED"),
        ("nova trains on", "SUCCEEDED"),
        ("job cannot start", "FAILED"),
        ("invalid dataset", "FAILED"),
        ("serverless succeeds", "SUCCEEDED"),
    ):
        run_id = scenarios.runs[name].run_id
        assert [n for n in notices if f" {run_id} " in n][0].startswith(
            f"{PREFIX} run {run_id} {status}"
        )
    assert len(notices) == 6


def test_a_run_stopped_by_hand_is_reaped_and_leaves_nothing(scenarios: Scenarios) -> None:
    run = scenarios.runs["stopped by hand"]
    assert run.described["status"] == "ABORTED"
    # Meanwhile its planes worked: two Wordle rollouts of three turns, each answered once and
    # kept once in the run's trajectory store.
    assert scenarios.exchange == {
        "completed": 2, "trajectories": 2, "responses": 2, "turns": 6, "dead-lettered": 1,
    }  # fmt: skip
    scheduled, on_request, idle, _ = scenarios.reaped
    ((reaped,),) = [scheduled["reaped"]]
    assert reaped["run_id"] == run.run_id and reaped["reason"] == "its execution is ABORTED"
    # Namespace, association, service account; the baseline evaluation and the trainer, each
    # its settings and its job.
    assert reaped["workers_stopped"] == 4 and reaped["job_objects_deleted"] == 3 + 2 * 2
    # Its config let the workers scale on the backlog: a target, a policy, then neither.
    operations = [c.operation for c in scenarios.world.recorder.calls[run.calls]]
    assert operations.count("PutScalingPolicy") == 1
    assert operations.count("DeregisterScalableTarget") == 1
    assert on_request["reaped"][0]["queues_deleted"] == 0  # repeated: nothing more to do
    assert idle == {"reaped": [], "retry": [], "unknown": None, "released_idle": False}
    _released(scenarios, run)


def test_a_run_torn_down_on_request_is_stopped_and_leaves_nothing(scenarios: Scenarios) -> None:
    run = scenarios.runs["torn down on request"]
    ((reaped,),) = [scenarios.reaped[-1]["reaped"]]
    assert (
        reaped["run_id"] == run.run_id
        and reaped["reason"] == "torn down on request (mtrl teardown)"
    )
    assert run.described["status"] == "ABORTED"
    _released(scenarios, run)


def test_the_deploy_installs_the_hyperpod_chart_and_the_destroy_removes_it(
    scenarios: Scenarios,
) -> None:
    created, deleted = scenarios.chart
    assert created["Status"] == deleted["Status"] == "SUCCESS", (created, deleted)
    installed = created["Data"]["Objects"]
    # With a restricted group: the training operator too (a Nova job's trainer is a PyTorchJob),
    # and the EKS add-ons' copies for restricted nodes (rig-aws-node, rig-coredns).
    assert installed == deleted["Data"]["Objects"] == len(rendering(kubeflow=True)) + 2
    daemonsets = scenarios.world.kubernetes.objects[
        "/apis/apps/v1/namespaces/kube-system/daemonsets"
    ]
    assert "aws-node" in daemonsets and not {"rig-aws-node", "rig-coredns"} & set(daemonsets)
    terms = daemonsets["aws-node"]["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][-1]["values"] == ["Restricted"]  # kept off them
    assert (
        created["PhysicalResourceId"]
        == deleted["PhysicalResourceId"]
        == ("nova-mtrl-eks/hyperpod-dependencies")
    )
    # The kubeflow namespace is the chart's alone: gone with it, after the launcher's RBAC.
    assert "kubeflow" not in scenarios.world.kubernetes.objects["/api/v1/namespaces"]
    # The installer signed as itself: it read its rendering and found the cluster (the IAM
    # proof checks both against its role), then the objects went again (the namespaces every
    # cluster has stay, and the add-ons EKS installed).
    world = scenarios.world
    installer = {
        (call.service, call.operation)
        for call in world.recorder.calls
        if "HyperPodChartInstaller" in call.principal
    }
    assert installer == {("s3", "GetObject"), ("eks", "DescribeCluster")}
    api = world.kubernetes
    assert set(api.objects["/apis/apps/v1/namespaces/kube-system/daemonsets"]) == {"aws-node"}
    assert "aws-hyperpod" not in api.objects["/api/v1/namespaces"]


def test_the_deploy_applies_the_pipelines_rbac_and_the_destroy_removes_it(
    scenarios: Scenarios,
) -> None:
    created, deleted = scenarios.rbac
    # The pipeline's four, and the launcher's Role and RoleBinding (in the kubeflow namespace
    # the chart's training operator made: it stays for the chart to remove) and its admission
    # policy and binding.
    assert (created["Status"], created["Data"]["Objects"]) == ("SUCCESS", 8)
    assert (deleted["Status"], deleted["Data"]["Objects"]) == ("SUCCESS", 8)
    assert (
        created["PhysicalResourceId"] == deleted["PhysicalResourceId"] == "nova-mtrl-pipeline-rbac"
    )


def test_every_registered_run_that_ended_is_an_mlflow_run_of_the_deployment(
    scenarios: Scenarios,
) -> None:
    """NotifyEnd logs each run to the deployment's tracking server, with its own role (the
    proof above allows every call): what it became, its config, its steps and its files. A
    dataset refused before registration has no config to log; a run stopped by hand never
    reaches NotifyEnd."""
    mlflow = scenarios.world.mlflow
    by_name = {run["info"]["run_name"]: run for run in mlflow.runs.values()}
    runs = scenarios.runs
    assert set(by_name) == {
        runs[name].run_id
        for name in (
            "succeeds", "nova succeeds", "nova trains on", "job cannot start",
            "serverless succeeds",
        )
    }  # fmt: skip
    succeeded, failed = by_name[runs["succeeds"].run_id], by_name[runs["job cannot start"].run_id]
    assert succeeded["info"]["status"] == "FINISHED" and failed["info"]["status"] == "FAILED"
    assert "failure" in failed["tags"] and succeeded["params"]["name"] == "scaling"
    steps = {step for key, _, step, _ in succeeded["metrics"] if key == "train/mean_reward"}
    assert steps == {line["step"] for line in runs["succeeds"].metrics} != set()
    (experiment,) = mlflow.experiments.values()
    folder = f"mlflow/{experiment['experiment_id']}/{succeeded['info']['run_id']}/artifacts/"
    files = {key.removeprefix(folder) for key in scenarios.mlflow_files if key.startswith(folder)}
    assert files == {"summary.json", "evaluation.json"}
    # The end notification says where it is.
    (notice,) = [
        n for n in scenarios.notifications if f"run {runs['succeeds'].run_id} SUCCEEDED" in n
    ]
    assert f"experiment tracking: MLflow run {succeeded['info']['run_id']} ({mlflow.arn})" in notice


def test_a_serverless_run_starts_its_managed_job_whose_rollouts_reach_its_run_only(
    scenarios: Scenarios,
) -> None:
    """The serverless plane end to end on the AWS backends: Submit starts the run's managed job
    (its name the run's, the job role passed), which, as that role, reads its train channel and
    invokes the agent Lambda; each request lands on that run's queue; the held-out records are
    played the same way by AWS's evaluation jobs of the base model before and of the trained
    package after, their reports the run's evaluation; the run completes with its job, and
    nothing of it is left."""
    run = scenarios.runs["serverless succeeds"]
    assert run.described["status"] == "SUCCEEDED", run.described
    world, name = scenarios.world, job_name(PREFIX, run.run_id)
    job = world.managed_jobs.jobs[name]
    assert job["JobStatus"] == "Completed"
    assert job["RoleArn"] == f"arn:aws:iam::{ACCOUNT}:role/{PREFIX}-agent-rft-job"
    document = json.loads(job["JobConfigDocument"])
    assert document["TrainingConfig"]["BaseModelArn"].endswith(
        ":aws:hub-content/SageMakerPublicHub/Model/nova-textgeneration-lite-v2/1.0.0"
    )
    played = scenarios.agent_answers[name]
    assert len(played["agent"]) == 2
    assert all(a["run_id"] == run.run_id and a["forwarded"] for a in played["agent"].values())
    # The run's worker played both at the job's runtime: three guesses, CRANE at the third,
    # each reported once, and kept in the run's trajectory store.
    assert played["completed"] == played["kept"] == 2
    for status, rewards, turns in played["trajectories"].values():
        assert (status, turns, len(rewards)) == ("ready", 3, 1) and rewards[0] > 0.5
    calls = world.recorder.calls[run.calls]
    by_job_role = {(c.service, c.operation) for c in calls if c.principal == job["RoleArn"]}
    assert by_job_role == {("s3", "GetObject"), ("lambda", "Invoke")}  # its channels, the agent
    runtime = [(c.operation, c.principal) for c in calls if c.service == "sagemakerjobruntime"]
    assert {operation for operation, _ in runtime} == {"Sample", "CompleteRollout", "UpdateReward"}
    assert all("RewardFleetTaskRole" in principal for _, principal in runtime)
    submitted = [
        c.operation for c in calls if "SubmitJob" in c.principal and c.service == "sagemaker"
    ]
    assert submitted == ["DescribeJob", "DescribeHubContent", "CreateJob"]
    # Collect records the package the job registered the model as (it registers none itself).
    assert run.summary is not None and run.summary["model_package"] == (
        f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:model-package/{PREFIX}-models/1"
    )
    # Its evaluations: AWS's evaluation jobs, started by the evaluation step with the job role,
    # played through the agent and the run's worker in their phase, the trained package after.
    for stage in EvaluationStage:
        name = job_name(PREFIX, run.run_id, stage)
        evaluation = world.managed_jobs.jobs[name]
        assert (evaluation["JobCategory"], evaluation["JobStatus"]) == (
            "AgentRFTEvaluation", "Completed",
        )  # fmt: skip
        assert evaluation["RoleArn"] == job["RoleArn"]
        played = scenarios.agent_answers[name]
        assert played["agent"] and all(a["stage"] == stage for a in played["agent"].values())
        assert played["completed"] == played["kept"] == len(played["agent"])
    final = json.loads(
        world.managed_jobs.jobs[job_name(PREFIX, run.run_id, EvaluationStage.FINAL)][
            "JobConfigDocument"
        ]
    )
    assert final["ModelPackageConfig"] == {"InputModelPackageArn": run.summary["model_package"]}
    started = [
        c.operation for c in calls if "StartEvaluation" in c.principal and c.service == "sagemaker"
    ]
    assert started.count("CreateJob") == 2
    evaluated = run.summary["evaluation"]
    assert evaluated["baseline"]["n"] == evaluated["final"]["n"] > 0
    # No GPU node asked for; workers started and stopped; queues gone.
    assert world.sagemaker.updates[run.updates] == []
    assert run.left == {"active services": 0, "task definitions": 0, "parameters": 0, "queues": []}
