"""The key attributes of the deployment's DynamoDB tables: the stacks declare the tables with
them, the runtime reads and writes items by them."""

from __future__ import annotations

# The router's conversation table (lambdas/router/conversations.py): each run's items under its
# run id, each item's own name as the sort key, deleted by DynamoDB after its expiry (epoch s).
CONVERSATION_PARTITION_KEY = "run_id"
CONVERSATION_SORT_KEY = "item"
CONVERSATION_EXPIRY = "expires_at"
# The capacity leases (lambdas/pipeline/hyperpod_capacity.py): an item per instance group,
# keyed `<cluster>/<group>`.
LEASE_KEY = "instance_group"
