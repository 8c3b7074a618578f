"""Conversation state in DynamoDB: runs, rollouts and model steps, written conditionally.

One table, key (`run_id`, `item`), TTL on `expires_at`:
- `run`: the run's token hash, queue URLs and expiry (what the proxy needs to serve a caller),
  and the run's open phase (`phase`, set by `open_phase`: what its queues carry now; unset
  until the pipeline opens the first); deleted at teardown (`remove_run`);
- `queue#<name>`: which run a queue belongs to (under `run_id` = `queue#<name>`), for the
  consumer, which only knows the queue a message came from;
- `job#<name>`: which run a SageMaker managed multi-turn RL job (training, or a held-out
  evaluation) belongs to, for the agent forwarder, which only knows the job a rollout request
  names;
- `step#<step_id>`: one model turn: `pending -> processing -> completed | failed`;
- `rollout#<sample_id>`: one episode: `processing -> completed | failed`;
- `sample#<sample_id>`: which phase of the run (training, or an evaluation) a sample was last
  asked for in, by the rollout forwarder (lambdas/router/rollout_forwarder.py): the phase of its
  report;
- the rollout Lambda's lease (under `run_id` = `lease#rollout-lambda`): the one run whose Nova
  jobs the deployment's rollout Lambda serves (`holder`), until it is released at teardown or
  expires with the run's registration;
- `report#<request id>`: one rollout report as it was accepted (its score, success flag, time,
  phase and episode), written once and never changed: what a run's reward curve is made of
  (lambdas/pipeline/reward_curve.py), and a Nova run's held-out evaluations.
Every transition is a conditional write, so a redelivered message can neither add a turn nor
overwrite a finished one.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from domain.episodes import Episode, EvaluationStage, phase_of
from domain.tables import CONVERSATION_EXPIRY, CONVERSATION_PARTITION_KEY, CONVERSATION_SORT_KEY

DEFAULT_TTL_SECONDS = 14 * 24 * 3600
# A run's registration (its token) lasts until its deadline and this much after: its job and
# evaluations end by the deadline, its last reports come soon after; teardown deletes it sooner.
REGISTRATION_GRACE_SECONDS = 3600
# Not a run id: those are lower-case letters, digits and `-` (domain/runs.run_id_for).
ROLLOUT_LAMBDA_LEASE = "lease#rollout-lambda"


def create_table(dynamodb: Any, table_name: str) -> None:
    """The table as the CDK construct declares it (for local mode and tests)."""
    dynamodb.create_table(
        TableName=table_name,
        KeySchema=[
            {"AttributeName": CONVERSATION_PARTITION_KEY, "KeyType": "HASH"},
            {"AttributeName": CONVERSATION_SORT_KEY, "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": CONVERSATION_PARTITION_KEY, "AttributeType": "S"},
            {"AttributeName": CONVERSATION_SORT_KEY, "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    dynamodb.update_time_to_live(
        TableName=table_name,
        TimeToLiveSpecification={"Enabled": True, "AttributeName": CONVERSATION_EXPIRY},
    )


@dataclass(frozen=True)
class RouterRegistration:
    """What the router knows of a run it serves: who may speak for it, its queues, and the
    model it trains (named in the completions it serves)."""

    run_id: str
    token_sha256: str
    queues: dict[str, str]
    model: str
    expires_at: float = float("inf")

    def accepts(self, token: str | None, *, now: float) -> bool:
        """The run's own token, before its registration expired (DynamoDB's TTL deletes an
        expired item only some time after)."""
        if not token or now >= self.expires_at:
            return False
        return hmac.compare_digest(self.token_sha256, token_digest(token))


@dataclass(frozen=True)
class Step:
    run_id: str
    step_id: str
    sample_id: str
    status: str
    result: dict[str, Any] | None
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class ReportedRollout:
    """One accepted rollout report: its score (None: the rollout failed), its success flag
    (None: not reported), when it was accepted, its key (which orders reports accepted at the
    same time), and how its episode ended."""

    key: str
    reported_at: float
    score: float | None
    success: bool | None
    episode: Episode | None = None


class RolloutLambdaHeld(RuntimeError):
    """Another run's Nova jobs hold the deployment's rollout Lambda."""

    def __init__(self, run_id: str, holder: str, until: float) -> None:
        held = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(until))
        super().__init__(
            f"run {run_id}: the deployment's rollout Lambda serves run {holder}'s Nova jobs until "
            f"that run is torn down (at the latest {held}). A Nova job invokes the function "
            "itself, unqualified, as AWS's Forge SDK passes it, so it serves one Nova run at a "
            "time, as the Forge SDK's stack does; upload this run again once that one has ended, "
            "or deploy a second platform (another name_prefix) for Nova runs side by side"
        )
        self.holder, self.until = holder, until


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class ConversationStore:
    def __init__(
        self, dynamodb: Any, table_name: str, *, ttl_seconds: int = DEFAULT_TTL_SECONDS
    ) -> None:
        self._db = dynamodb
        self._table = table_name
        self._ttl = ttl_seconds

    # --- runs ------------------------------------------------------------------------------

    def put_run(
        self,
        run_id: str,
        *,
        token: str,
        queues: dict[str, str],
        model: str,
        now: float,
        deadline_at: float | None = None,
        jobs: tuple[str, ...] = (),
    ) -> None:
        """Register the run: its token (hashed), its queues, each queue's owner, and the owner of
        its managed jobs (`jobs`, a serverless run's job names). The registration expires
        `REGISTRATION_GRACE_SECONDS` after the run's deadline (without one, with the table's
        items)."""
        expires = _registration_expiry(deadline_at) if deadline_at is not None else now + self._ttl
        item = {
            "run_id": {"S": run_id},
            "item": {"S": "run"},
            "token_sha256": {"S": token_digest(token)},
            "queues": {"S": json.dumps(queues, sort_keys=True)},
            "model": {"S": model},
            "created_at": {"N": repr(now)},
            "expires_at": {"N": str(int(expires))},
        }
        if jobs:
            item["jobs"] = {"SS": list(jobs)}
        self._db.put_item(TableName=self._table, Item=item)
        owned = [_queue_key(url) for url in queues.values()] + [_job_key(job) for job in jobs]
        for key in owned:
            self._db.put_item(
                TableName=self._table,
                Item={
                    "run_id": {"S": key},
                    "item": {"S": "run"},
                    "owner": {"S": run_id},
                    "expires_at": {"N": str(int(expires))},
                },
            )

    def remove_run(self, run_id: str) -> bool:
        """Delete the run's registration (its token) and its queues' owner records, so nothing
        speaks for the run once it is torn down; False when there was none. Its turns and reports
        stay until the table's TTL (the run's record of what happened)."""
        item = self._get(run_id, "run")
        if item is None:
            return False
        for url in json.loads(item.get("queues", {}).get("S", "{}")).values():
            self._delete(_queue_key(url), "run")
        for job in item.get("jobs", {}).get("SS", []):
            self._delete(_job_key(job), "run")
        self._delete(run_id, "run")
        return True

    def get_run(self, run_id: str) -> RouterRegistration | None:
        item = self._get(run_id, "run")
        if item is None or "token_sha256" not in item:
            return None
        return RouterRegistration(
            run_id=run_id,
            token_sha256=item["token_sha256"]["S"],
            queues=json.loads(item["queues"]["S"]),
            model=item["model"]["S"],
            expires_at=float(item["expires_at"]["N"]) if "expires_at" in item else float("inf"),
        )

    def open_phase(self, run_id: str, phase: str, *, now: float) -> str | None:
        """`phase` of the run is open from now; the one before it has ended. Returns the phase
        that was open (None: this is the first)."""
        answer = self._db.update_item(
            TableName=self._table,
            Key={"run_id": {"S": run_id}, "item": {"S": "run"}},
            UpdateExpression="SET #phase = :phase, updated_at = :now",
            ExpressionAttributeNames={"#phase": "phase"},
            ExpressionAttributeValues={":phase": {"S": phase}, ":now": {"N": repr(now)}},
            ReturnValues="UPDATED_OLD",
        )
        return answer.get("Attributes", {}).get("phase", {}).get("S")

    def phase(self, run_id: str) -> str | None:
        """The run's open phase (None: none opened yet)."""
        item = self._get(run_id, "run")
        return item["phase"]["S"] if item and "phase" in item else None

    # --- the rollout Lambda ----------------------------------------------------------------

    def hold_rollout_lambda(self, run_id: str, *, deadline_at: float, now: float) -> None:
        """The rollout Lambda serves `run_id` from now until it is released, or until the run's
        registration would expire; raises RolloutLambdaHeld while another run holds it."""
        until = _registration_expiry(deadline_at)
        try:
            self._db.update_item(
                TableName=self._table,
                Key={"run_id": {"S": ROLLOUT_LAMBDA_LEASE}, "item": {"S": "run"}},
                UpdateExpression="SET holder = :run, expires_at = :until, updated_at = :now",
                ConditionExpression=(
                    "attribute_not_exists(holder) OR holder = :run OR expires_at < :now"
                ),
                ExpressionAttributeValues={
                    ":run": {"S": run_id},
                    ":until": {"N": str(int(until))},
                    ":now": {"N": repr(now)},
                },
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as error:
            if not _conditional(error):
                raise
            held = error.response.get("Item", {})
            raise RolloutLambdaHeld(
                run_id, held["holder"]["S"], float(held["expires_at"]["N"])
            ) from None

    def release_rollout_lambda(self, run_id: str) -> None:
        """The rollout Lambda no longer serves `run_id` (nothing happens if it did not)."""
        try:
            self._db.delete_item(
                TableName=self._table,
                Key={"run_id": {"S": ROLLOUT_LAMBDA_LEASE}, "item": {"S": "run"}},
                ConditionExpression="holder = :run",
                ExpressionAttributeValues={":run": {"S": run_id}},
            )
        except ClientError as error:
            if not _conditional(error):
                raise

    def rollout_lambda_holder(self, *, now: float | None = None) -> str | None:
        """The run the rollout Lambda serves (with `now`: None once its lease has expired)."""
        item = self._get(ROLLOUT_LAMBDA_LEASE, "run")
        if item is None or (now is not None and float(item["expires_at"]["N"]) < now):
            return None
        return item["holder"]["S"]

    def run_of_queue(self, queue_arn_or_url: str) -> str | None:
        item = self._get(_queue_key(queue_arn_or_url), "run")
        return item["owner"]["S"] if item else None

    def run_of_job(self, job_name: str, *, now: float) -> str | None:
        """The run whose managed job this is (None: no run's, or its registration expired)."""
        item = self._get(_job_key(job_name), "run")
        if item is None or float(item["expires_at"]["N"]) < now:
            return None
        return item["owner"]["S"]

    # --- steps -----------------------------------------------------------------------------

    def start_step(self, run_id: str, step_id: str, *, sample_id: str, now: float) -> bool:
        """Record a new model turn as pending; False if it was already recorded."""
        return self._put_new(
            run_id,
            f"step#{step_id}",
            {"sample_id": {"S": sample_id}, "status": {"S": "pending"}},
            now,
        )

    def set_step_status(
        self, run_id: str, step_id: str, status: str, *, expected: str, now: float
    ) -> bool:
        return self._transition(run_id, f"step#{step_id}", status, (expected,), now)

    def complete_step(
        self, run_id: str, step_id: str, result: dict[str, Any], *, now: float
    ) -> str:
        """`completed`, `duplicate` (already finished: left as it was) or `unknown` (no such step)."""
        written = self._transition(
            run_id,
            f"step#{step_id}",
            "completed",
            ("pending",),
            now,
            extra={"result": {"S": json.dumps(result)}},
        )
        if written:
            return "completed"
        return "duplicate" if self._get(run_id, f"step#{step_id}") else "unknown"

    def get_step(self, run_id: str, step_id: str) -> Step | None:
        item = self._get(run_id, f"step#{step_id}")
        if item is None:
            return None
        return Step(
            run_id=run_id,
            step_id=step_id,
            sample_id=item["sample_id"]["S"],
            status=item["status"]["S"],
            result=json.loads(item["result"]["S"]) if "result" in item else None,
            created_at=float(item["created_at"]["N"]),
            updated_at=float(item["updated_at"]["N"]),
        )

    # --- rollouts --------------------------------------------------------------------------

    def begin_rollout(self, run_id: str, sample_id: str, *, now: float) -> bool:
        """Mark the sample's episode in flight (its first model turn); a finished record of the
        same sample id is replaced (a new request for it). False if it is already in flight."""
        try:
            self._db.put_item(
                TableName=self._table,
                Item=self._fresh(
                    run_id, f"rollout#{sample_id}", {"status": {"S": "processing"}}, now
                ),
                ConditionExpression="attribute_not_exists(#item) OR #status <> :processing",
                ExpressionAttributeNames={"#item": "item", "#status": "status"},
                ExpressionAttributeValues={":processing": {"S": "processing"}},
            )
            return True
        except ClientError as error:
            if _conditional(error):
                return False
            raise

    def finish_rollout(
        self, run_id: str, sample_id: str, *, failed: bool, score: float | None, now: float
    ) -> bool:
        """Mark the rollout finished once; False if it already was (a duplicate report)."""
        status = "failed" if failed else "completed"
        extra = {"score": {"N": repr(score)}} if score is not None else {}
        if self._put_new(run_id, f"rollout#{sample_id}", {"status": {"S": status}, **extra}, now):
            return True  # reported without any model turn through the proxy
        return self._transition(
            run_id, f"rollout#{sample_id}", status, ("processing",), now, extra=extra
        )

    # --- phases and reports ----------------------------------------------------------------

    def mark_sample(
        self, run_id: str, sample_id: str, *, stage: EvaluationStage | None, now: float
    ) -> None:
        """Sample `sample_id` is asked for in `stage`'s evaluation (None: in training)."""
        fields = {"stage": {"S": stage}} if stage else {}
        self._db.put_item(
            TableName=self._table, Item=self._fresh(run_id, f"sample#{sample_id}", fields, now)
        )

    def sample_phase(self, run_id: str, sample_id: str) -> str | None:
        """The phase sample `sample_id` was last asked for in through the rollout Lambda
        (None: never, e.g. asked for straight on the run's queue)."""
        item = self._get(run_id, f"sample#{sample_id}")
        if item is None:
            return None
        return phase_of(EvaluationStage(item["stage"]["S"]) if "stage" in item else None)

    def record_report(
        self,
        run_id: str,
        request_id: str,
        *,
        episode: Episode,
        stage: EvaluationStage | None,
        now: float,
    ) -> bool:
        """Keep the report of request `request_id` once; False if it was already kept (a retried
        report)."""
        fields: dict[str, Any] = {"episode": {"S": episode.model_dump_json(exclude_none=True)}}
        if episode.score is not None:
            fields["score"] = {"N": repr(episode.score)}
        if episode.success is not None:
            fields["success"] = {"BOOL": episode.success}
        if stage:
            fields["stage"] = {"S": stage}
        return self._put_new(run_id, f"report#{request_id}", fields, now)

    def reports(self, run_id: str, stage: EvaluationStage | None = None) -> list[ReportedRollout]:
        """Every report the run's rollouts were accepted with in training (or in `stage`'s
        evaluation), in the order they were."""
        paginator = self._db.get_paginator("query")
        pages = paginator.paginate(
            TableName=self._table,
            KeyConditionExpression="run_id = :run AND begins_with(#item, :prefix)",
            # Every name aliased: none may collide with DynamoDB's reserved words.
            ExpressionAttributeNames={
                "#item": "item",
                "#at": "created_at",
                "#score": "score",
                "#success": "success",
                "#stage": "stage",
                "#episode": "episode",
            },
            ExpressionAttributeValues={":run": {"S": run_id}, ":prefix": {"S": "report#"}},
            ProjectionExpression="#item, #at, #score, #success, #stage, #episode",
        )
        found = [
            ReportedRollout(
                key=item["item"]["S"],
                reported_at=float(item["created_at"]["N"]),
                score=float(item["score"]["N"]) if "score" in item else None,
                success=item["success"]["BOOL"] if "success" in item else None,
                episode=(
                    Episode.model_validate_json(item["episode"]["S"]) if "episode" in item else None
                ),
            )
            for page in pages
            for item in page["Items"]
            if item.get("stage", {}).get("S") == (stage or None)
        ]
        return sorted(found, key=lambda report: (report.reported_at, report.key))

    def run_summary(self, run_id: str, *, now: float, stuck_after_seconds: float) -> dict[str, int]:
        """How many rollouts of the run are in flight, finished, failed, and stuck (in flight
        with no change for `stuck_after_seconds`)."""
        counts: Counter[str] = Counter(in_flight=0, finished=0, failed=0, stuck=0)
        paginator = self._db.get_paginator("query")
        pages = paginator.paginate(
            TableName=self._table,
            KeyConditionExpression="run_id = :run AND begins_with(#item, :prefix)",
            ExpressionAttributeNames={"#item": "item", "#status": "status"},
            ExpressionAttributeValues={":run": {"S": run_id}, ":prefix": {"S": "rollout#"}},
            ProjectionExpression="#status, updated_at",
        )
        for page in pages:
            for item in page["Items"]:
                status = item["status"]["S"]
                if status == "processing":
                    counts["in_flight"] += 1
                    if now - float(item["updated_at"]["N"]) > stuck_after_seconds:
                        counts["stuck"] += 1
                elif status == "completed":
                    counts["finished"] += 1
                else:
                    counts["failed"] += 1
        return dict(counts)

    # --- plumbing --------------------------------------------------------------------------

    def _get(self, run_id: str, item: str) -> dict[str, Any] | None:
        answer = self._db.get_item(
            TableName=self._table,
            Key={"run_id": {"S": run_id}, "item": {"S": item}},
            ConsistentRead=True,
        )
        return answer.get("Item")

    def _delete(self, run_id: str, item: str) -> None:
        self._db.delete_item(
            TableName=self._table, Key={"run_id": {"S": run_id}, "item": {"S": item}}
        )

    def _fresh(self, run_id: str, item: str, fields: dict[str, Any], now: float) -> dict[str, Any]:
        return {
            "run_id": {"S": run_id},
            "item": {"S": item},
            **fields,
            "created_at": {"N": repr(now)},
            "updated_at": {"N": repr(now)},
            "expires_at": {"N": str(int(now + self._ttl))},
        }

    def _put_new(self, run_id: str, item: str, fields: dict[str, Any], now: float) -> bool:
        try:
            self._db.put_item(
                TableName=self._table,
                Item=self._fresh(run_id, item, fields, now),
                ConditionExpression="attribute_not_exists(#item)",
                ExpressionAttributeNames={"#item": "item"},
            )
            return True
        except ClientError as error:
            if _conditional(error):
                return False
            raise

    def _transition(
        self,
        run_id: str,
        item: str,
        status: str,
        allowed_from: tuple[str, ...],
        now: float,
        *,
        extra: dict[str, Any] | None = None,
    ) -> bool:
        names = {"#status": "status", "#item": "item"}
        values: dict[str, Any] = {":status": {"S": status}, ":now": {"N": repr(now)}}
        sets = ["#status = :status", "updated_at = :now"]
        for index, (name, value) in enumerate((extra or {}).items()):
            names[f"#x{index}"] = name
            values[f":x{index}"] = value
            sets.append(f"#x{index} = :x{index}")
        allowed = []
        for index, previous in enumerate(allowed_from):
            values[f":from{index}"] = {"S": previous}
            allowed.append(f":from{index}")
        try:
            self._db.update_item(
                TableName=self._table,
                Key={"run_id": {"S": run_id}, "item": {"S": item}},
                UpdateExpression="SET " + ", ".join(sets),
                ConditionExpression=f"attribute_exists(#item) AND #status IN ({', '.join(allowed)})",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            )
            return True
        except ClientError as error:
            if _conditional(error):
                return False
            raise


def _registration_expiry(deadline_at: float) -> int:
    return int(deadline_at + REGISTRATION_GRACE_SECONDS)


def _queue_key(queue_arn_or_url: str) -> str:
    """The queue's name, from an ARN (`arn:...:name`) or a URL (`https://.../account/name`)."""
    name = queue_arn_or_url.rsplit(":", 1)[-1].rsplit("/", 1)[-1]
    return f"queue#{name}"


def _job_key(job_name: str) -> str:
    return f"job#{job_name}"


def _conditional(error: ClientError) -> bool:
    return error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException"
