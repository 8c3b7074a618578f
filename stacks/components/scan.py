"""Outside scanners' findings justified in the template itself: checkov reads a resource's
`Metadata.checkov.skip` (`{"id", "comment"}` each, checkov's documented suppression), so a
reviewer who runs it over cdk.out reads every reason beside the resource it is about.
`make scan` (the Makefile) fails on a finding without one."""

from __future__ import annotations

from aws_cdk import CfnResource
from constructs import IConstruct

from stacks.components.nag import require_reason

METADATA_KEY = "checkov"


def justify(construct: IConstruct, check: str, reason: str) -> None:
    """Skip checkov's `check` (e.g. `CKV_AWS_116`) on `construct`'s resource, for `reason`."""
    require_reason(reason, f"skipping {check}")
    resource = construct if isinstance(construct, CfnResource) else construct.node.default_child
    if not isinstance(resource, CfnResource):
        raise TypeError(
            f"{construct.node.path} has no CloudFormation resource to justify {check} on"
        )
    skips = [
        skip
        for skip in (resource.get_metadata(METADATA_KEY) or {}).get("skip", [])
        if skip["id"] != check
    ]
    resource.add_metadata(METADATA_KEY, {"skip": [*skips, {"id": check, "comment": reason}]})
