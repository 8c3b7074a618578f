"""The pipeline's Lambda entry points, one per step (lambdas/pipeline/composition.py): each
hands its event to the step composed once per container from the function's environment."""

from __future__ import annotations

import os

from lambdas.clients import lambda_entries
from lambdas.pipeline.composition import compose

_entry = lambda_entries(compose, os.environ)

start_run = _entry("start_run")
validate = _entry("validate")
register = _entry("register")
provision = _entry("provision")
scale_up = _entry("scale_up")
nodes_ready = _entry("nodes_ready")
start_workers = _entry("start_workers")
workers_healthy = _entry("workers_healthy")
open_phase = _entry("open_phase")
submit_job = _entry("submit_job")
start_evaluation = _entry("start_evaluation")
evaluation_status = _entry("evaluation_status")
monitor = _entry("monitor")
collect = _entry("collect")
release_compute = _entry("release_compute")
teardown = _entry("teardown")
notify_end = _entry("notify_end")
reap = _entry("reap")
release_idle = _entry("release_idle")
