"""`topoguard audit --cluster PATH [-o text|json|html] [--scope opted-in|all] [--config F]`.

The live map's audit (app/engine/audit.py) on a `kubectl get` snapshot that holds the jobs and their
pods (DESIGN.md "Round 2", Audit). Exit 0: nothing found; 1: some job has a finding; 2: bad input.
The text leads with one line per job with findings (its most telling finding), then every finding
of those jobs; JSON is `{"jobs": [JobAudit.to_json(), ...]}`, every job in scope; html is the map of
app/commands/audit_map.py (zones as columns, jobs as rows, blocked flows drawn), one self-contained page.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TextIO

from app.cache.files import SnapshotError, load_snapshot
from app.commands.audit_map import render_html
from app.config import ConfigError, load_settings
from app.engine.audit import AuditFinding, JobAudit, audit

EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2

# Which finding a job's lead line shows: what stops training first.
_LEAD_ORDER = {"blocked": 0, "zone-closed": 1, "split": 2, "unknown": 3}


def lead(job: JobAudit) -> AuditFinding:
    """The finding a job's one-line summary shows."""
    return min(job.findings, key=lambda f: _LEAD_ORDER.get(f.type, len(_LEAD_ORDER)))


def _zones(job: JobAudit) -> str:
    placed = ", ".join(f"{zone} {n}" for zone, n in job.zones.items()) or "none bound"
    return f"pods: {placed}; pending {job.pending}"


def render_text(audits: Sequence[JobAudit], scope: str) -> str:
    found = [a for a in audits if a.findings]
    lines: list[str] = []
    for job in found:
        first = lead(job)
        more = len(job.findings) - 1
        lines.append(f"{job.ref}: {first.message}" + (f" (+{more} more)" if more else ""))
    if found:
        lines.append("")
    for job in found:
        lines.append(f"{job.ref} ({_zones(job)})")
        lines += [f"  {f.type}: {f.message}" for f in job.findings]
        lines.append("")
    if not audits:
        lines.append(f"no training jobs in scope ({scope})")
    else:
        lines.append(f"{len(audits)} training job{'s' if len(audits) != 1 else ''} audited (scope {scope}), "
                     f"{len(found)} with findings")
    return "\n".join(lines) + "\n"


def to_json(audits: Sequence[JobAudit]) -> dict[str, object]:
    return {"jobs": [a.to_json() for a in audits]}


def run(args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out, err = stdout or sys.stdout, stderr or sys.stderr
    try:
        settings = load_settings(args.config)
        if args.scope:
            settings = settings.model_copy(update={"audit": settings.audit.model_copy(update={"scope": args.scope})})
        snapshot = load_snapshot(args.cluster, gpu_resources=settings.gpu_resources,
                                 cilium_config=settings.cilium_config, collective_ports=settings.collective_ports)
    except (ConfigError, SnapshotError) as e:
        print(f"topoguard audit: {e}", file=err)
        return EXIT_USAGE
    audits = audit(snapshot, settings)
    if args.output == "json":
        json.dump(to_json(audits), out, indent=2, ensure_ascii=False)
        out.write("\n")
    elif args.output == "html":
        zones = sorted({n.labels.get(settings.zone_label, "") for n in snapshot.nodes} - {""})
        out.write(render_html(audits, zones))
    else:
        out.write(render_text(audits, settings.audit.scope))
    return EXIT_FINDINGS if any(a.findings for a in audits) else EXIT_CLEAN
