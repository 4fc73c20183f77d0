"""`topoguard explain JOB.yaml --cluster PATH [-o text|json] [--config F]`: the map for one job.

Runs the same engine as the webhook on a job file and a snapshot and prints, per candidate
zone, the GPU nodes, free/needed GPUs, the GPUs admitted jobs reserve there (RESERVED, and which
jobs), whether the job fits now or would wait (CAPACITY), every required flow's verdict with the
policy behind it, then the chosen zone and the JSON Patch the mutating webhook would return.

Exit codes: 0 a zone was chosen, 1 no zone works (the reasons are printed), 2 unusable input
(unreadable file, not one job object, unsupported kind, malformed job, bad config or snapshot).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

from app import engine, jobs, policy
from app.admission.pipeline import unsupported_message
from app.cache.files import SnapshotError, load_snapshot
from app.config import ConfigError, Settings, load_settings
from app.engine import lead, ledger, patches
from app.engine.flows import describe_check, describe_flow, describe_reason, describe_sides
from app.jobs import status as job_status
from app.models import labels
from app.models.cilium import CiliumAgent
from app.models.cluster import Snapshot
from app.models.decision import Decision, FlowCheck, ZoneReport
from app.models.job import JobGroup
from app.policy import agent as agents

EXIT_CHOSEN, EXIT_NONE, EXIT_USAGE = 0, 1, 2


class InputError(ValueError):
    """The job file cannot be used."""


def read_job(path: str) -> dict[str, Any]:
    """The one job object in a YAML or JSON file (`-` reads standard input)."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read: {e}") from e
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise InputError(f"{path}: not valid YAML or JSON: {e}") from e
    if len(documents) != 1:
        raise InputError(f"{path}: expected exactly one job object, found {len(documents)} documents")
    job = documents[0]
    if not isinstance(job, dict):
        raise InputError(f"{path}: expected a Kubernetes object, got {type(job).__name__}")
    return job


def _namespace(job: Mapping[str, Any]) -> str:
    meta = job.get("metadata")
    namespace = meta.get("namespace") if isinstance(meta, Mapping) else None
    return str(namespace) if namespace else "default"


def _flow_json(check: FlowCheck) -> dict[str, Any]:
    v = check.verdict
    return {
        "src": check.flow.src,
        "dst": check.flow.dst,
        "ports": str(check.flow.ports),
        "protocol": check.flow.protocol,
        "purpose": check.flow.purpose,
        "verdict": v.verdict,
        "egress": v.egress.verdict,
        "ingress": v.ingress.verdict,
        "reasons": [describe_reason(r) for r in v.reasons or (*v.egress.reasons, *v.ingress.reasons)],
    }


def _hold_json(hold: ledger.Hold) -> dict[str, Any]:
    return {"job": hold.job, "gpus": hold.total, "created": hold.created}


def _zone_json(report: ZoneReport, holders: Sequence[ledger.Hold] = ()) -> dict[str, Any]:
    return {
        "zone": report.zone,
        "gpuNodes": report.gpu_nodes,
        "gpusFree": report.gpus_free,
        "gpusNeeded": report.gpus_needed,
        "fits": report.fits,
        "fitsText": fits_text(report),
        "network": report.network,
        "eligible": report.eligible,
        "problems": list(report.problems),
        "flows": [_flow_json(c) for c in report.flows],
        "capacity": report.capacity,
        "gpusAllocatable": report.gpus_allocatable,
        "gpusReserved": report.gpus_reserved,
        "reservedBy": [_hold_json(h) for h in holders],
        "capacityNote": report.capacity_note,
    }


def to_json(
    group: JobGroup,
    decision: Decision,
    patch: Sequence[Mapping[str, Any]],
    holds: Mapping[str, Sequence[ledger.Hold]] | None = None,
    *,
    scope: str = "",
) -> dict[str, Any]:
    """The machine-readable explanation (`-o json`); `holds`: the jobs that reserve GPUs, per zone;
    `scope`: why the webhook would not review the job ("" when it would)."""
    holds = holds or {}
    return {
        "job": {"apiVersion": group.api_version, "kind": group.kind, "namespace": group.namespace, "name": group.name},
        "webhookReviews": not scope.startswith("the webhook will not"),
        "scope": scope,
        "lead": decision.lead,
        "allowed": decision.allowed,
        "zone": decision.zone,
        "zones": [_zone_json(z, holds.get(z.zone, ())) for z in decision.zones],
        "reasons": list(decision.reasons),
        "tolerations": {k: [dict(t) for t in v] for k, v in decision.tolerations.items()},
        "labels": dict(decision.labels),
        "openZones": list(decision.open_zones),
        "warnings": list(decision.warnings),
        "summary": decision.summary,
        "excludedZones": {z: list(p) for z, p in decision.excluded_zones.items()},
        "patch": list(patch),
        "capacity": decision.capacity,
        "clique": decision.clique,
        "cliqueReplicas": list(decision.clique_replicas),
    }


def webhook_scope(snapshot: Snapshot, namespace: str) -> str:
    """Why the webhook would not review a job of `namespace` (its namespaceSelector), or "" when it would."""
    known = snapshot.namespaces.get(namespace)
    if known is None:
        if "Namespace" in snapshot.missing_kinds or not snapshot.namespaces:
            return ""
        return (f"namespace {namespace} is not in the snapshot: the webhook reviews its jobs only if it is labelled "
                f"{labels.ENABLED_LABEL}=true")
    if known.labels.get(labels.ENABLED_LABEL) != "true":
        return f"the webhook will not review this job: namespace {namespace} lacks {labels.ENABLED_LABEL}=true"
    return ""


def fits_text(report: ZoneReport) -> str:
    """The FITS column: `yes`, `no capacity` (GPUs short) or `cannot run here` (selectors, taints, ...)."""
    if report.fits:
        return "yes"
    if any("cannot run here" in p for p in report.problems):
        return "cannot run here"
    return "no capacity"


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _flow_lines(check: FlowCheck) -> list[str]:
    v = check.verdict
    lines = [f"    {v.verdict:<7} {describe_flow(check.flow)}  [{check.flow.purpose}]"]
    lines += [f"              {text}" for text in describe_sides(v)]
    return lines


def render_text(
    group: JobGroup,
    decision: Decision,
    patch: Sequence[Mapping[str, Any]],
    settings: Settings,
    holds: Mapping[str, Sequence[ledger.Hold]] | None = None,
    *,
    scope: str = "",
) -> str:
    """The human-readable map: the lead sentence, zone table, flows per zone, the choice and the patch.

    `scope`: why the webhook would not review the job (`webhook_scope`), said first; the analysis follows.
    """
    holds = holds or {}
    pods = sum(r.count for r in group.replicas)
    gpus = sum(r.count * r.gpus_per_pod for r in group.replicas)
    out = [f"note: {scope}" for scope in [scope] if scope]
    out += [
        f"{'Admitted' if decision.allowed else 'Refused'}: {decision.lead}.",
        "",
        f"{group.kind} {group.namespace}/{group.name}: {len(group.replicas)} replica types, {pods} pods, "
        f"{gpus} GPUs, {len(group.flows)} required flows (coordinator: {group.coordinator})",
        "",
    ]
    shown: set[str] = set()
    if decision.zones:
        rows = [["ZONE", "GPU NODES", "GPUS FREE/NEEDED", "RESERVED", "CAPACITY", "FITS", "NETWORK", "ELIGIBLE"]]
        rows += [
            [z.zone, str(z.gpu_nodes), f"{z.gpus_free}/{z.gpus_needed}", str(z.gpus_reserved), z.capacity or "-",
             fits_text(z), z.network, _yes(z.eligible)]
            for z in decision.zones
        ]
        out += _table(rows)
        for z in decision.zones:
            out += ["", f"{z.zone}:"]
            for check in z.flows:
                out += _flow_lines(check)
            flow_problems = {describe_check(c) for c in z.flows}  # said in the flow's own lines above
            out += [f"    problem: {p}" for p in z.problems if p not in flow_problems]
            shown.update(z.problems)
            if z.capacity_note:
                out.append(f"    capacity: {z.capacity_note}")
            out += [f"    reserved: {h.total} GPUs by {h.job}" for h in holds.get(z.zone, ())]
    else:
        out.append("no candidate zone")
    for zone, problems in sorted(decision.excluded_zones.items()):
        out += ["", f"{zone}: not a candidate"] + [f"    problem: {p}" for p in problems]
        shown.update(problems)
    out.append("")
    if decision.allowed:
        out.append(
            f"chosen zone: {decision.zone} (zoneStrategy {settings.zone_strategy}, mode {settings.mode}, "
            f"capacity={decision.capacity or 'now'}, capacityPolicy {settings.capacity_policy})"
        )
        if decision.clique:
            out.append(f"NVLink clique: {decision.clique} ({settings.clique_label}; replicas "
                       f"{', '.join(decision.clique_replicas)} join a ComputeDomain and stay in one clique)")
        for key, tolerations in sorted(decision.tolerations.items()):
            listed = ", ".join(f"{t.get('key')}={t.get('value', '')}:{t.get('effect')}" for t in tolerations)
            out.append(f"tolerations added to {key}: {listed}")
        if decision.labels:
            out.append("labels set on every replica: " + ", ".join(f"{k}={v}" for k, v in decision.labels.items()))
    else:
        # Only what the lead and the zones above have not said already.
        rest = [r for r in lead.remaining_reasons(decision) if r.split(": ", 1)[-1] not in shown]
        if rest:
            out.append("also:")
            out += [f"  - {r}" for r in rest]
    out += [f"warning: {w}" for w in decision.warnings]
    if decision.allowed:
        out += ["", f"patch ({len(patch)} operations):"]
        out += [f"  {json.dumps(op, sort_keys=True)}" for op in patch]
    return "\n".join(out) + "\n"


def _holds(snapshot: Snapshot, settings: Settings, group: JobGroup) -> dict[str, tuple[ledger.Hold, ...]]:
    """Per zone, the stored jobs that reserve GPUs there (the job itself left out, as the decision does)."""
    built = ledger.ledger_of(snapshot, gpu_resources=settings.gpu_resources)
    own = (group.kind, group.namespace, group.name)
    out: dict[str, list[ledger.Hold]] = {}
    for hold in built.holds:
        if hold.key != own:
            out.setdefault(hold.zone, []).append(hold)
    return {zone: tuple(held) for zone, held in out.items()}


def run(args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out, err = stdout or sys.stdout, stderr or sys.stderr
    try:
        settings = load_settings(args.config)
        snapshot = load_snapshot(args.cluster, cilium_config=settings.cilium_config)
        raw = read_job(args.job)
        group = jobs.parse_job(raw, gpu_resources=settings.gpu_resources, namespace=_namespace(raw),
                               limits=settings.limits, runtimes=snapshot.training_runtimes,
                               collective_ports=settings.collective_ports)
        decision = engine.decide(group, snapshot, settings, suspended=job_status.is_suspended(raw))
        patch = patches.build_patch(raw, group, decision, settings) if decision.allowed else []
        holds = _holds(snapshot, settings, group)
    except jobs.UnsupportedKindError as e:
        print(f"topoguard explain: {unsupported_message(e)}", file=err)  # the webhook's wording
        return EXIT_USAGE
    except (ConfigError, SnapshotError, InputError, jobs.JobError, patches.PatchError) as e:
        print(f"topoguard explain: {e}", file=err)
        return EXIT_USAGE
    scope = webhook_scope(snapshot, group.namespace)
    agent = policy.snapshot_agent(snapshot, settings.cilium_version, settings.explicit_policy_enforcement())
    if args.output == "json":
        body = {**to_json(group, decision, patch, holds, scope=scope), "ciliumSettings": agents.sources_json(agent)}
        json.dump(engine.render_json(body, group.name), out, indent=2, ensure_ascii=False)
        out.write("\n")
    else:
        text = engine.render(render_text(group, decision, patch, settings, holds, scope=scope), group.name)
        out.write(text.rstrip("\n") + "\n" + cilium_settings_text(agent))
    return EXIT_CHOSEN if decision.allowed else EXIT_NONE


def cilium_settings_text(agent: CiliumAgent) -> str:
    """The compact "Cilium settings" section: each value the verdicts used and where it came from."""
    return "\nCilium settings (value, source):\n" + "".join(f"  {line}\n" for line in agents.describe_sources(agent))
