"""The reward worker loop: bounded concurrency, visibility heartbeats, poison handling, clean stop.

Guarantees, per rollout request:
- exactly one response is sent for a request it completes (the response is deduplicated on
  the request's message id, so even a redelivered request cannot produce a second one);
- a request it cannot complete is released, never deleted, so another worker takes it;
- a message that is not a valid v0 request goes to the dead-letter queue at once, and a
  request that keeps failing for other reasons goes there after `max_receives` attempts;
- on `stop()` (SIGTERM) it takes no new work, waits up to the grace period for the episodes
  in flight, releases the rest and returns.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum

from domain.protocol import ProtocolError, RolloutRequest, episode_seed, parse
from domain.trajectories import Trajectory
from reward_envs.interface import Environment
from reward_envs.worker.model_client import ModelClient
from reward_envs.worker.queues import Delivery, SqsRolloutQueues
from reward_envs.worker.rollout import Rollout, play_rollout
from reward_envs.worker.settings import WorkerSettings
from reward_envs.worker.trajectory_store import TrajectoryStore

# How often the heartbeat looks for tasks due an extension: an extension is at most this late,
# far inside the third of the visibility timeout (at least 10 s) it has to spare.
HEARTBEAT_TICK_SECONDS = 0.2

log = logging.getLogger("mtrl.worker")


def read_v0(body: str) -> RolloutRequest:
    """A v0 rollout request, as a trainer of ours or Nova's sends one."""
    return parse(RolloutRequest, body)


class TaskState(Enum):
    RUNNING = "running"
    SENDING = "sending"
    DONE = "done"
    RELEASED = "released"


@dataclass
class Task:
    delivery: Delivery
    last_extended: float
    state: TaskState = TaskState.RUNNING
    lock: threading.Lock = field(default_factory=threading.Lock)
    future: Future | None = None


@dataclass
class WorkerStats:
    completed: int = 0
    released: int = 0
    dead_lettered: int = 0
    protocol_errors: int = 0
    failures: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)


class _Completer:
    """Batches finished rollouts from all episode threads into few SQS calls (one send batch,
    one delete batch for up to ten); each caller waits for its own outcome."""

    # How long a finished rollout may wait for others to share its SQS calls.
    LINGER_SECONDS = 0.005

    def __init__(self, queues: SqsRolloutQueues) -> None:
        self._queues = queues
        self._pending: queue.Queue[tuple[Delivery, object, Future] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="completer", daemon=True)
        self._thread.start()

    def complete(self, delivery: Delivery, response: object) -> None:
        done: Future = Future()
        self._pending.put((delivery, response, done))
        done.result()

    def close(self) -> None:
        self._pending.put(None)
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while (first := self._pending.get()) is not None:
            batch = [first]
            closing = False
            lingering_until = time.monotonic() + self.LINGER_SECONDS
            while len(batch) < 10:
                try:
                    item = self._pending.get(timeout=max(0.0, lingering_until - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    closing = True
                    break
                batch.append(item)
            try:
                errors = self._queues.complete(
                    [(delivery, response) for delivery, response, _ in batch]
                )
            except Exception as error:  # noqa: BLE001 - every caller learns the batch failed
                errors = [error] * len(batch)
            for (_, _, done), error in zip(batch, errors, strict=True):
                if error is None:
                    done.set_result(None)
                else:
                    done.set_exception(error)
            if closing:
                return


class RewardWorker:
    def __init__(
        self,
        *,
        queues: SqsRolloutQueues,
        environment: Environment,
        model: ModelClient,
        settings: WorkerSettings,
        trajectories: TrajectoryStore | None = None,
        clock: Callable[[], float] = time.monotonic,
        read: Callable[[str], RolloutRequest] = read_v0,
    ) -> None:
        """`read`: a queued message as the rollout to play (ProtocolError: a poison message);
        v0 by default, a managed job's request in agent mode (reward_envs/worker/agent_mode.py)."""
        self.queues = queues
        self.read = read
        self.trajectories = trajectories
        self.environment = environment
        self.model = model
        self.settings = settings
        self.clock = clock
        self.stats = WorkerStats()
        self._stopping = threading.Event()
        self._tasks: dict[str, Task] = {}
        self._tasks_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(
            max_workers=settings.concurrency, thread_name_prefix="rollout"
        )
        self._completer = _Completer(queues)

    def close(self) -> None:
        """Wait for every pool thread, abandoned episodes included (embedding, tests)."""
        self._pool.shutdown(wait=True)

    def stop(self) -> None:
        """Stop taking work (SIGTERM handler); `run` then drains and returns."""
        self._stopping.set()

    def run(self, *, exit_when_idle: bool = False) -> WorkerStats:
        """Work until `stop()`, or, with `exit_when_idle`, until the queue is empty and nothing runs."""
        heartbeat = threading.Thread(
            target=self._heartbeat, name="visibility-heartbeat", daemon=True
        )
        heartbeat.start()
        try:
            while not self._stopping.is_set():
                in_flight = self._in_flight()
                free = self.settings.concurrency - in_flight
                # Every free slot is filled while requests wait: a step's slowest rollout is what
                # the trainer (and its GPUs) waits for.
                if free <= 0:
                    self._wait_for_a_task(timeout=1.0)
                    continue
                deliveries = self.queues.receive(
                    max_messages=free,
                    wait_seconds=0 if exit_when_idle else self.settings.wait_seconds,
                    visibility_timeout=self.settings.visibility_timeout_seconds,
                )
                self._start(deliveries)
                if exit_when_idle and not deliveries:
                    if self._in_flight() == 0:
                        break
                    self._wait_for_a_task(timeout=0.5)
        finally:
            self._drain()
            self._stopping.set()
            heartbeat.join(timeout=5)
        return self.stats

    def _in_flight(self) -> int:
        with self._tasks_lock:
            return len(self._tasks)

    def _running(self) -> list[Future]:
        with self._tasks_lock:
            return [task.future for task in self._tasks.values() if task.future is not None]

    def _wait_for_a_task(self, timeout: float) -> None:
        if futures := self._running():
            wait(futures, timeout=timeout, return_when=FIRST_COMPLETED)

    def _start(self, deliveries: list[Delivery]) -> None:
        """Requests of one message group run one after another, in order (FIFO semantics);
        groups run concurrently."""
        chains: dict[str, list[tuple[Task, RolloutRequest]]] = {}
        for delivery in deliveries:
            try:
                request = self.read(delivery.body)
            except ProtocolError as problem:
                self.stats.count("protocol_errors")
                log.warning("poison message %s: %s", delivery.message_id, problem)
                self._poison(delivery, str(problem))
                continue
            task = Task(delivery=delivery, last_extended=self.clock())
            with self._tasks_lock:
                self._tasks[delivery.receipt_handle] = task
            chains.setdefault(delivery.group_id or delivery.message_id, []).append((task, request))
        for chain in chains.values():
            future = self._pool.submit(self._work_chain, chain)
            for task, _ in chain:
                task.future = future

    def _work_chain(self, chain: list[tuple[Task, RolloutRequest]]) -> None:
        for position, (task, request) in enumerate(chain):
            if not self._work(task, request):
                # A request of this group failed: give back the ones behind it, in order.
                for later, _ in chain[position + 1 :]:
                    self._give_back(later)
                return

    def _work(self, task: Task, request: RolloutRequest) -> bool:
        """Play the rollout and report it; False if the request was given back instead."""
        try:
            with task.lock:
                if task.state is not TaskState.RUNNING:
                    return False
            played = play_rollout(
                self.environment,
                self.model,
                request,
                max_turns=self.settings.max_turns,
                timeout=self.settings.rollout_timeout_seconds,
                seed=episode_seed(self.settings.run_id or "", request.record_id),
                clock=self.clock,
            )
            ended = datetime.now(UTC)  # before the trainer can learn of it
            with task.lock:
                if task.state is not TaskState.RUNNING:
                    return False  # released during shutdown: another worker will answer it
                task.state = TaskState.SENDING
            self._completer.complete(task.delivery, played.response)
            task.state = TaskState.DONE
            self.stats.count("completed")
            self._keep(request, played, ended)
            return True
        except Exception as error:  # noqa: BLE001 - the message is retried or dead-lettered
            self.stats.count("failures")
            log.exception("rollout %s failed outside the episode", request.sample_id)
            task.state = TaskState.DONE
            self._retry_or_poison(task.delivery, f"{type(error).__name__}: {error}")
            return False
        finally:
            self._forget(task)

    def _keep(self, request: RolloutRequest, played: Rollout, ended: datetime) -> None:
        """The rollout into the trajectory store, once its response is sent: one per rollout.
        A trajectory that cannot be kept is logged; the rollout it records stands."""
        if self.trajectories is None:
            return
        try:
            self.trajectories.add(self._trajectory(request, played, ended))
        except Exception:  # noqa: BLE001 - the answer is sent; its record is not worth a retry
            log.exception("the trajectory of %s could not be kept", request.sample_id)

    def _trajectory(self, request: RolloutRequest, played: Rollout, ended: datetime) -> Trajectory:
        response = played.response
        return Trajectory(
            run_id=self.settings.run_id or "",
            sample_id=request.sample_id,
            record_id=request.record_id,
            finished_at=ended,
            stop_reason=response.stop_reason,
            reward=response.aggregate_score,
            turn_rewards=played.turn_rewards,
            finish_reasons=played.finish_reasons,
            policy_version=min(played.policy_versions, default=None),
            messages=played.messages,
            metrics={metric.name: metric.value for metric in response.metrics},
            error=response.error,
            environment=self.environment.name,
            environment_version=self.environment.version,
            config_hash=self.settings.config_hash,
            writer=self.trajectories.writer if self.trajectories else "",
        )

    def _give_back(self, task: Task) -> None:
        with task.lock:
            if task.state is not TaskState.RUNNING:
                return
            task.state = TaskState.RELEASED
        self._quietly(self.queues.release, task.delivery)
        self.stats.count("released")
        self._forget(task)

    def _forget(self, task: Task) -> None:
        with self._tasks_lock:
            self._tasks.pop(task.delivery.receipt_handle, None)

    def _retry_or_poison(self, delivery: Delivery, reason: str) -> None:
        if delivery.receive_count >= self.settings.max_receives:
            self._poison(delivery, f"failed {delivery.receive_count} times, last: {reason}")
        else:
            delay = min(self.settings.retry_delay_seconds * delivery.receive_count, 60)
            self._quietly(self.queues.release, delivery, delay_seconds=delay)

    def _poison(self, delivery: Delivery, reason: str) -> None:
        if self.queues.dead_letter_url is None:
            # Without a DLQ of our own, the queue's redrive policy moves it after maxReceiveCount.
            self._quietly(self.queues.release, delivery)
            return
        self._quietly(self.queues.dead_letter, delivery, reason)
        self.stats.count("dead_lettered")

    def _heartbeat(self) -> None:
        interval = self.settings.visibility_timeout_seconds / 3
        while not self._stopping.wait(HEARTBEAT_TICK_SECONDS):
            now = self.clock()
            with self._tasks_lock:
                due = [t for t in self._tasks.values() if now - t.last_extended >= interval]
            for task in due:
                with task.lock:
                    if task.state is not TaskState.RUNNING:
                        continue
                if self._quietly(
                    self.queues.extend, task.delivery, self.settings.visibility_timeout_seconds
                ):
                    task.last_extended = now

    def _drain(self) -> None:
        if running := self._running():
            wait(running, timeout=self.settings.shutdown_grace_seconds)
        with self._tasks_lock:
            left = list(self._tasks.values())
        for task in left:
            self._give_back(task)
        # Sends already under way finish; released episodes are abandoned where they are.
        for task in left:
            if task.state is TaskState.SENDING and task.future is not None:
                task.future.result(timeout=30)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._completer.close()
        if self.trajectories is not None:
            self.trajectories.close()

    @staticmethod
    def _quietly(action: Callable[..., object], *args: object, **kwargs: object) -> bool:
        try:
            action(*args, **kwargs)
            return True
        except Exception:  # noqa: BLE001 - SQS hiccups must not kill the loop; SQS retries delivery
            log.exception("queue call %s failed", getattr(action, "__name__", action))
            return False
