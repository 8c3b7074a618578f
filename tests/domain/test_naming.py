"""Run resources are named so that `<prefix>-run-*` selects one deployment's runs and nothing else:
no name another deployment makes for a run, and no name of the platform's own resources."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from domain.naming import prefix_problem, run_prefix, run_resource_name, stack_name
from domain.run_queues import QueueKind, queue_name

# A name_prefix as the config takes it (stacks/config.py `_NAME`), before the `-run` rule.
PREFIXES = st.from_regex(r"[a-z][a-z0-9-]{0,10}[a-z0-9]", fullmatch=True).filter(
    lambda p: "--" not in p
)
RUN_IDS = st.from_regex(r"[a-z0-9][a-z0-9-]{0,30}", fullmatch=True)
PARTS = st.sampled_from(["storage", "network", "compute", "pipeline"])


def test_a_prefix_with_the_run_mark_at_a_boundary_is_refused() -> None:
    for refused in ("team-run", "a-run-b", "run-run"):
        assert prefix_problem(refused), refused
    for taken in ("nova-mtrl", "run", "run-x", "nova-runner", "prune-x", "a-rung"):
        assert prefix_problem(taken) is None, taken


@given(PREFIXES, PREFIXES, RUN_IDS)
def test_no_other_deployments_run_resource_matches_a_deployments_pattern(
    ours: str, theirs: str, run_id: str
) -> None:
    if ours == theirs or prefix_problem(ours) or prefix_problem(theirs):
        return
    names = [
        run_resource_name(theirs, run_id, "workers"),
        queue_name(theirs, run_id, QueueKind.DLQ),
    ]
    for name in names:
        assert not name.startswith(run_prefix(ours)), (ours, theirs, name)


@given(PREFIXES, PARTS, st.from_regex(r"[A-Za-z0-9]{1,20}", fullmatch=True))
def test_the_platforms_own_generated_names_are_outside_the_run_pattern(
    prefix: str, part: str, logical_id: str
) -> None:
    """CloudFormation names an unnamed resource `<stack>-<logical id>-<random>` (the upload
    rule's dead-letter queue, for one): never a run resource's name."""
    if prefix_problem(prefix):
        return
    generated = f"{stack_name(prefix, part)}-{logical_id}-ABC123"
    assert not generated.startswith(run_prefix(prefix))


def test_a_runs_names_keep_its_id_and_fit_their_services() -> None:
    name = queue_name("nova-mtrl", "wordle-0a1b2c3d4e", QueueKind.ROLLOUT_REQUESTS)
    assert name == "nova-mtrl-run-wordle-0a1b2c3d4e-rollout-requests.fifo"
    long = queue_name("nova-mtrl", "x" * 120, QueueKind.GENERATE_RESPONSES)
    assert len(long) <= 80 and long.startswith(run_prefix("nova-mtrl"))
    assert re.fullmatch(r"[A-Za-z0-9_-]+", run_resource_name("p", "a b/c"))
