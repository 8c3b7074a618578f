"""The IAM proof: every recorded request evaluated against the synthesized policies of the
principal that made it, and every grant those policies make checked for use."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tests.iam.authorization import Authorization, DependentNeed, Directory, Need
from tests.iam.deployment import Deployment
from tests.iam.kubernetes import allowed as kubernetes_allows
from tests.iam.kubernetes import parse as kubernetes_request
from tests.iam.policy import Grant, Policies, matches
from tests.iam.recorder import HARNESS, Call


@dataclass
class Report:
    requests: int = 0
    needs: list[Need] = field(default_factory=list)
    denied: list[str] = field(default_factory=list)
    used: set[Grant] = field(default_factory=set)
    dependents: set[DependentNeed] = field(default_factory=set)
    kubernetes_denied: list[str] = field(default_factory=list)

    @property
    def pairs(self) -> set[tuple[str, str]]:
        return {(need.principal, need.request.action) for need in self.needs}


class Proof:
    def __init__(
        self,
        deployment: Deployment,
        directory: Directory,
        policies: Mapping[str, Policies] | None = None,
    ) -> None:
        self.deployment = deployment
        self.directory = directory
        # Principals that are not roles of the app (the operator running `mtrl`) bring their own.
        self._extra = dict(policies or {})
        self._policies: dict[str, Policies] = {}

    def policies(self, principal: str) -> Policies | None:
        if principal in self._extra:
            return self._extra[principal]
        if principal not in self.deployment.roles:
            return None
        if principal not in self._policies:
            self._policies[principal] = self.deployment.policies(principal)
        return self._policies[principal]

    def check(self, calls: Iterable[Call]) -> Report:
        report = Report()
        authorization = Authorization(self.directory)
        for call in calls:
            if call.principal == HARNESS:
                self.directory.learn(call)
                continue
            report.requests += 1
            needs, dependents = authorization.needs(call)
            report.dependents.update(dependents)
            for need in needs:
                report.needs.append(need)
                policies = self.policies(need.principal)
                if policies is None:
                    report.denied.append(
                        f"{need.principal}: not a principal of the app ({need.why})"
                    )
                    continue
                decision = policies.evaluate(need.request)
                report.used.update(decision.grants)
                if not decision.allowed:
                    context = f" {dict(need.request.context)}" if need.request.context else ""
                    report.denied.append(
                        f"{_short(need.principal)} may not {need.request.action} on "
                        f"{need.request.resource}{context} — needed by {need.why}"
                    )
        return report

    def check_kubernetes(
        self, report: Report, callers: Iterable[tuple[str, str, str]], rbac: list[dict]
    ) -> None:
        entries = self.deployment.access_entries()
        for principal, method, path in callers:
            verbs = [kubernetes_request(method, path)]
            if method == "PATCH":  # server-side apply creates what is not there yet
                verbs.append(kubernetes_request(method, path, created=True))
            for request in verbs:
                if not kubernetes_allows(entries.get(principal), rbac, request):
                    report.kubernetes_denied.append(
                        f"{_short(principal)}: {request} ({method} {path})"
                    )

    def unused(self, report: Report, principals: Iterable[str]) -> dict[str, list[Grant]]:
        """Allow grants of `principals` that no request used (a grant of an action that an
        action the principal performed depends on counts as used: the service acts with it)."""
        found = {}
        for principal in principals:
            policies = self.policies(principal)
            if policies is None:
                continue
            dependents = {d.dependent for d in report.dependents if d.principal == principal}
            idle = sorted(
                (
                    g
                    for g in policies.grants()
                    if g not in report.used
                    and not any(matches(g.action, d, ignore_case=True) for d in dependents)
                ),
                key=lambda g: (g.action, g.resource),
            )
            if idle:
                found[principal] = idle
        return found


def _short(principal: str) -> str:
    return principal.rsplit("/", 1)[-1]


def explained(grant: Grant, principal: str, reasons: Mapping[tuple[str, str], str]) -> str | None:
    """The reason an unused grant is kept, if one is written for it ((principal pattern, action
    pattern) -> reason)."""
    for (who, action), reason in reasons.items():
        if matches(who, principal) and matches(action, grant.action, ignore_case=True):
            return reason
    return None
