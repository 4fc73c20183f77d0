"""`topoguard reach`: one flow's verdict between two pods of a snapshot (DESIGN.md "Contracts").

Owns: parsing `--from/--to` (`NS/POD` of the snapshot, or `NS:k=v,...` for a pod that does not
exist yet), `--port PORT[-END][/TCP|UDP|SCTP|ANY]`, the enforcement mode (flag, else settings),
and printing the verdict as text or JSON.
Exit codes: 0 allow, 1 deny, 3 unknown, 2 usage error (message on stderr).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping
from typing import Any, cast

from app import config
from app.cache import files
from app.models.cluster import Snapshot
from app.models.network import Endpoint, PolicyEnforcement, PortRange, Reason, SideVerdict, Verdict
from app.policy import agent as agents
from app.policy import check_flow, endpoint_for_pod, policy_problems

EXIT_CODES = {"allow": 0, "deny": 1, "unknown": 3}
EXIT_USAGE = 2
PROTOCOLS = ("TCP", "UDP", "SCTP", "ANY")
# Kubernetes label key (optional DNS prefix + name) and value syntax.
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class UsageError(ValueError):
    """A command-line value that cannot be used."""


def parse_port(text: str) -> tuple[PortRange, str]:
    """`9999`, `9999/UDP`, `30000-32767/TCP` → (PortRange, protocol); protocol defaults to TCP."""
    ports, slash, protocol = text.strip().partition("/")
    protocol = protocol.upper() if slash else "TCP"
    try:
        port_range = PortRange.parse(ports)
    except ValueError as e:
        raise UsageError(f"--port {text!r}: expected PORT[-END][/TCP|UDP|SCTP|ANY]: {e}") from None
    if protocol not in PROTOCOLS:
        raise UsageError(f"--port {text!r}: protocol must be one of {', '.join(PROTOCOLS)}")
    return port_range, protocol


def _parse_labels(text: str, ref: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value) or len(value) > 63:
            raise UsageError(f"{ref!r}: {item!r} is not a label key=value")
        labels[key] = value
    return labels


def resolve_endpoint(snapshot: Snapshot, ref: str) -> Endpoint:
    """`NS/POD` (a pod of the snapshot) or `NS:k=v,...` (a pod that does not exist yet)."""
    slash, colon = ref.find("/"), ref.find(":")
    if colon > 0 and (slash < 0 or colon < slash):
        namespace, _, text = ref.partition(":")
        return Endpoint(namespace, _parse_labels(text, ref), snapshot.namespace_labels(namespace))
    namespace, sep, name = ref.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise UsageError(f"{ref!r}: expected NS/POD or NS:key=value,...")
    for pod in snapshot.pods:
        if pod.namespace == namespace and pod.name == name:
            return endpoint_for_pod(snapshot, pod)
    raise UsageError(f"{ref!r}: no such pod in the snapshot")


def _reason_json(reason: Reason) -> dict[str, str]:
    return {
        "side": reason.side,
        "effect": reason.effect,
        "policy": reason.policy,
        "kind": reason.kind,
        "rule": reason.rule,
        "message": reason.message,
    }


def _side_json(side: SideVerdict) -> dict[str, Any]:
    return {"verdict": side.verdict, "reasons": [_reason_json(r) for r in side.reasons]}


def render_json(verdict: Verdict, flow: Mapping[str, Any], problems: list[tuple[str, str]]) -> str:
    return json.dumps(
        {
            "verdict": verdict.verdict,
            "reasons": [_reason_json(r) for r in verdict.reasons],
            "egress": _side_json(verdict.egress),
            "ingress": _side_json(verdict.ingress),
            "flow": dict(flow),
            "policyProblems": [{"policy": ref, "problem": p} for ref, p in problems],
        },
        indent=2,
    )


def _reason_line(reason: Reason) -> str:
    where = ""
    if reason.policy:
        where = f"{reason.kind} {reason.policy}" + (f" {reason.rule}" if reason.rule else "") + ": "
    return f"    [{reason.effect}] {where}{reason.message}"


def render_text(verdict: Verdict, flow: Mapping[str, Any], problems: list[tuple[str, str]]) -> str:
    lines = [f"{verdict.verdict.upper()}: {flow['from']} -> {flow['to']} on {flow['port']}/{flow['protocol']}"
             f" (policy enforcement: {flow['policyEnforcement']})"]
    for title, side in ((f"egress of {flow['from']}", verdict.egress), (f"ingress of {flow['to']}", verdict.ingress)):
        lines.append(f"  {title}: {side.verdict}")
        lines += [_reason_line(r) for r in side.reasons]
    if problems:
        lines.append("  problems of these policies:")
        lines += [f"    {ref}: {problem}" for ref, problem in problems]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        settings = config.load_settings(args.config)
        snapshot = files.load_snapshot(args.cluster, cilium_config=settings.cilium_config)
        explicit = args.policy_enforcement or settings.explicit_policy_enforcement()
        agent = agents.agent_settings(snapshot, version=settings.cilium_version, policy_enforcement=explicit)
        mode = agent.policy_enforcement
        src, dst = resolve_endpoint(snapshot, args.src), resolve_endpoint(snapshot, args.dst)
        ports, protocol = parse_port(args.port)
    except (files.SnapshotError, config.ConfigError, agents.AgentConfigError, UsageError) as e:
        print(f"topoguard reach: {e}", file=sys.stderr)
        return EXIT_USAGE
    verdict = check_flow(snapshot, src, dst, ports, protocol, enforcement=cast(PolicyEnforcement, mode), agent=agent)
    flow = {"from": args.src, "to": args.dst, "port": str(ports), "protocol": protocol, "policyEnforcement": mode}
    # Only the problems of policies that took part in this verdict; `explain`/`/map` show the rest.
    involved = {r.policy for r in verdict.reasons if r.policy}
    problems = [(ref, problem) for ref, problem in policy_problems(snapshot) if ref in involved]
    render = render_json if args.output == "json" else render_text
    print(render(verdict, flow, problems))
    return EXIT_CODES[verdict.verdict]
