"""The synthesized app as if deployed (the local names of mtrl/local/physical.py, in every stack,
imports resolved between them): who its IAM roles are, what their identity policies say, and
which of them EKS lets into Kubernetes as whom."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from mtrl.local.physical import LocalNames, exports
from tests.iam.policy import Policies, Statement


@dataclass(frozen=True)
class Role:
    stack: str
    logical_id: str
    arn: str
    name: str
    managed_policies: tuple[str, ...]  # their documents are AWS's: the proof cannot see them


@dataclass(frozen=True)
class AccessEntry:
    principal: str
    groups: tuple[str, ...]
    policies: tuple[str, ...]


class Deployment:
    def __init__(
        self,
        templates: Mapping[str, dict[str, Any]],
        known: Mapping[str, Mapping[str, dict[str, Any]]] | None = None,
    ) -> None:
        """`known[stack][logical id]`: resources that exist already, under their own ids."""
        self.templates = dict(templates)
        self.exports = exports(self.templates, known)
        self.names = {
            stack: LocalNames(t, self.exports, (known or {}).get(stack))
            for stack, t in self.templates.items()
        }
        self.roles = {role.arn: role for role in self._roles()}

    def resolve(self, stack: str, value: Any) -> Any:
        return self.names[stack].resolve(value)

    def resources(self, kind: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
        """(stack, logical id, resource) of every resource of `kind`."""
        for stack, template in self.templates.items():
            for logical_id, resource in template["Resources"].items():
                if resource["Type"] == kind:
                    yield stack, logical_id, resource

    def _roles(self) -> Iterator[Role]:
        for stack, logical_id, resource in self.resources("AWS::IAM::Role"):
            names = self.names[stack][logical_id]
            properties = resource["Properties"]
            managed = tuple(
                str(self.resolve(stack, arn)) for arn in properties.get("ManagedPolicyArns", [])
            )
            yield Role(stack, logical_id, names["Arn"], names["Ref"], managed)

    def role(self, stack: str, logical_id: str) -> Role:
        return self.roles[self.names[stack][logical_id]["Arn"]]

    def policies(self, role_arn: str) -> Policies:
        """The role's identity policies: inline, and every AWS::IAM::Policy attached to it in
        any stack (grants on a role of another stack attach by its name)."""
        role = self.roles[role_arn]
        statements: list[Statement] = []
        role_properties = self.templates[role.stack]["Resources"][role.logical_id]["Properties"]
        for document in role_properties.get("Policies", []):
            statements += self._statements(
                role.stack,
                f"{role.logical_id}/{document['PolicyName']}",
                document["PolicyDocument"],
            )
        for kind in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            for stack, logical_id, resource in self.resources(kind):
                attached = {
                    str(self.resolve(stack, r)) for r in resource["Properties"].get("Roles", [])
                }
                if role.name in attached:
                    statements += self._statements(
                        stack, f"{stack}/{logical_id}", resource["Properties"]["PolicyDocument"]
                    )
        return Policies(statements)

    def managed_policy(self, logical_prefix: str) -> Policies:
        """The statements of the one customer managed policy whose logical id starts so."""
        ((stack, logical_id, resource),) = [
            found
            for found in self.resources("AWS::IAM::ManagedPolicy")
            if found[1].startswith(logical_prefix)
        ]
        return Policies(
            self._statements(
                stack, f"{stack}/{logical_id}", resource["Properties"]["PolicyDocument"]
            )
        )

    def _statements(self, stack: str, source: str, document: dict[str, Any]) -> list[Statement]:
        resolved = self.resolve(stack, document)
        return [
            Statement.parse(source, index, raw) for index, raw in enumerate(resolved["Statement"])
        ]

    def access_entries(self) -> dict[str, AccessEntry]:
        """EKS access entries by principal ARN: its Kubernetes groups and access policies."""
        entries = {}
        for stack, _, resource in self.resources("AWS::EKS::AccessEntry"):
            properties = self.resolve(stack, resource["Properties"])
            entries[properties["PrincipalArn"]] = AccessEntry(
                principal=properties["PrincipalArn"],
                groups=tuple(properties.get("KubernetesGroups") or ()),
                policies=tuple(p["PolicyArn"] for p in properties.get("AccessPolicies") or ()),
            )
        return entries
