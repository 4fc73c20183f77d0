"""`topoguard audit -o html`: the audit as one self-contained page an operator can open (issue 27).

Zones are columns, jobs are rows, each job's pods are drawn in the zone they run in (pending ones in a column
of their own), every flow a finding names is an arrow from the source pods' zone to the destination's,
labelled with the port and the policies that block it, and each row says the GPUs the job's bound pods hold
and, for a blocked or split job, the GPU-hours that wastes every hour it stays so.

One file, no network: inline CSS and SVG, and a few lines of script that check the drawing once the browser
has laid it out (each arrow has a length and starts and ends in the columns of its zones; the result lands in
`<body data-flows-drawn data-flows-placed>`), which tests read back from headless chromium.
"""

from __future__ import annotations

import html
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.engine.audit import SEVERITY_ORDER, JobAudit, by_kind

PENDING = "pending"
UNZONED = "no zone"
# Findings whose GPUs are wasted while they last (app.metrics.AUDIT_WASTE_FINDINGS, counted the same way).
WASTE = ("blocked", "split")

LABEL_W = 290  # the job column
COL_W = 250  # each zone column
HEAD_H = 54
POD = 12  # a pod's square, its spacing
PODS_PER_LINE = 14
FLOW_LINE = 17  # one flow's caption line
PAD = 12
CHAR_W = 6.8  # the width of a caption's character, at most (12 px DejaVu Sans)
ARROWS_H = 34  # the band under the pods where a row's arrows bend

COLOURS = {"blocked": "#c62828", "zone-closed": "#ad1457", "split": "#ef6c00", "unknown": "#8d6e63"}
ROLE_COLOURS = ("#1565c0", "#2e7d32", "#6a1b9a", "#00838f", "#4e342e", "#37474f")


@dataclass(frozen=True)
class _Cell:
    role: str
    pods: int
    gpus: int


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _wrap(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width` characters, broken at spaces."""
    lines: list[str] = []
    line = ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line] if line else lines


def map_zones(audits: Sequence[JobAudit], zones: Sequence[str]) -> list[str]:
    """The columns: the cluster's zones, then the places pods are in that are not a zone."""
    columns = list(dict.fromkeys(zones))
    seen = {z for a in audits for p in a.pods if p.bound for z in [p.zone or UNZONED]}
    columns += sorted(z for z in seen if z not in columns)
    if any(not p.bound for a in audits for p in a.pods):
        columns.append(PENDING)
    return columns


def _cells(job: JobAudit) -> dict[str, list[_Cell]]:
    """Per column: the job's pods there, per replica type."""
    counts: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for pod in job.pods:
        column = (pod.zone or UNZONED) if pod.bound else PENDING
        entry = counts[column][pod.role or "other"]
        entry[0] += 1
        entry[1] += pod.gpus
    return {c: [_Cell(r, n, g) for r, (n, g) in sorted(roles.items())] for c, roles in counts.items()}


@dataclass(frozen=True)
class _Arrow:
    """The flows of one finding between the same replica types and the same two columns: one arrow."""

    finding: str
    src: str  # column
    dst: str
    caption: str
    policies: tuple[str, ...]
    ports: tuple[str, ...]
    verdict: str


def _arrows(job: JobAudit) -> list[_Arrow]:
    """One arrow per (finding, replica types, source column, destination column) the findings' flows name."""
    grouped: dict[tuple[str, str, str, str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for finding in job.findings:
        for flow in finding.flows:
            sources = [*flow.get("srcZones", ())] + ([PENDING] if flow.get("srcPending") else [])
            targets = [*flow.get("dstZones", ())] + ([PENDING] if flow.get("dstPending") else [])
            for src in sources:
                for dst in targets:
                    grouped[(finding.type, str(flow.get("src")), str(flow.get("dst")), src, dst)].append(flow)
    out = []
    for (kind, src_role, dst_role, src, dst), flows in grouped.items():
        ports = tuple(dict.fromkeys(str(f.get("port")) for f in flows))
        policies = tuple(dict.fromkeys(str(p) for f in flows for p in f.get("policies", ())))
        verdict = "deny" if all(f.get("verdict") == "deny" for f in flows) else "unknown"
        why = f"denied by {by_kind(policies)}" if policies and verdict == "deny" else f"{verdict} ({kind})"
        caption = f"✕ {src} → {dst}: {src_role} → {dst_role} on {', '.join(ports)} {why}"
        out.append(_Arrow(kind, src, dst, caption, policies, ports, verdict))
    return out


def _severity(finding_type: str) -> int:
    return SEVERITY_ORDER.index(finding_type) if finding_type in SEVERITY_ORDER else len(SEVERITY_ORDER)


def _role_colour(role: str, roles: list[str]) -> str:
    if role not in roles:
        roles.append(role)
    return ROLE_COLOURS[roles.index(role) % len(ROLE_COLOURS)]


def _pods_height(cells: Mapping[str, list[_Cell]]) -> int:
    tallest = 0
    for column in cells.values():
        height = 0
        for cell in column:
            lines = -(-cell.pods // PODS_PER_LINE)
            height += 16 + lines * POD + 6
        tallest = max(tallest, height)
    return max(tallest, 40)


def render_svg(audits: Sequence[JobAudit], zones: Sequence[str]) -> str:
    columns = map_zones(audits, zones)
    x_of = {c: LABEL_W + i * COL_W for i, c in enumerate(columns)}
    width = LABEL_W + len(columns) * COL_W
    roles = sorted({p.role or "other" for a in audits for p in a.pods})  # the same colour for a role in every row
    rows: list[str] = []
    y = HEAD_H
    chars = int((width - 2 * PAD) / CHAR_W)
    for number, job in enumerate(audits):
        cells = _cells(job)
        flows = _arrows(job)
        pods_h = _pods_height(cells)
        captions = [(arrow, _wrap(arrow.caption, chars)) for arrow in flows]
        types = Counter(f.type for f in job.findings)
        label_h = (3 + max(len(types), 1)) * 16 + PAD
        top_h = max(pods_h + PAD + (ARROWS_H + 6 * len(flows) if flows else PAD), label_h)
        height = top_h + sum(len(lines) for *_, lines in captions) * FLOW_LINE + (PAD if flows else 0)
        worst = job.worst()
        parts = [f'<g class="job" data-job="{_esc(job.ref)}" data-finding="{_esc(worst or "none")}">']
        parts.append(f'<rect class="row{" odd" if number % 2 else ""}" x="0" y="{y}" width="{width}" '
                     f'height="{height}"/>')
        # The job's label: name, findings, GPUs.
        ty = y + PAD + 12
        parts.append(f'<text class="job-kind" x="{PAD}" y="{ty}">{_esc(job.kind)} {_esc(job.namespace)}/</text>')
        parts.append(f'<text class="job-name" x="{PAD}" y="{ty + 17}">{_esc(job.name)}</text>')
        ty += 34
        for kind in sorted(types, key=_severity):
            messages = " | ".join(f.message for f in job.findings if f.type == kind)
            times = f" \u00d7{types[kind]}" if types[kind] > 1 else ""
            parts.append(f'<text class="finding" x="{PAD}" y="{ty}" fill="{COLOURS.get(kind, "#555")}">'
                         f'● {_esc(kind)}{times}<title>{_esc(messages)}</title></text>')
            ty += 16
        if not job.findings:
            parts.append(f'<text class="finding ok" x="{PAD}" y="{ty}">✓ nothing found</text>')
            ty += 16
        gpus = f"{job.gpus} GPU{'s' if job.gpus != 1 else ''} held"
        if worst in WASTE and job.gpus:
            gpus += f" · {job.gpus} GPU-hour{'s' if job.gpus != 1 else ''} wasted per hour"
        parts.append(f'<text class="gpus{" waste" if worst in WASTE else ""}" x="{PAD}" y="{ty}">{_esc(gpus)}</text>')
        # The pods, per column and replica type.
        for column, column_cells in cells.items():
            cx, cy = x_of[column] + PAD, y + PAD
            for cell in column_cells:
                colour = _role_colour(cell.role, roles)
                gpu_text = f" · {cell.gpus} GPU" if cell.gpus else ""
                parts.append(f'<text class="role" x="{cx}" y="{cy + 11}" fill="{colour}">'
                             f'{_esc(cell.role)} \u00d7{cell.pods}{gpu_text}</text>')
                cy += 16
                for i in range(cell.pods):
                    px = cx + (i % PODS_PER_LINE) * POD
                    py = cy + (i // PODS_PER_LINE) * POD
                    kind = "pod gpu" if cell.gpus else "pod"
                    parts.append(f'<rect class="{kind}" x="{px}" y="{py}" width="{POD - 3}" height="{POD - 3}" '
                                 f'rx="2" fill="{colour}" data-zone="{_esc(column)}" data-role="{_esc(cell.role)}"/>')
                cy += -(-cell.pods // PODS_PER_LINE) * POD + 6
        # The flows: an arrow from the source pods' column to the destination's, bending under the pods, and a
        # caption under the row naming the port and the policies.
        arrow_y = y + PAD + pods_h + 4
        for i, arrow in enumerate(flows):
            colour = COLOURS.get(arrow.finding, "#555")
            src, dst = arrow.src, arrow.dst
            x1 = x_of[src] + COL_W * (0.12 + 0.1 * i)
            x2 = x_of[dst] + COL_W * (0.55 + 0.1 * i)
            if src == dst:
                x2 = x1 + COL_W * 0.3
            bend = ARROWS_H + 6 * i
            low = arrow_y + bend
            d = f"M {x1:.1f} {arrow_y:.1f} C {x1:.1f} {low:.1f} {x2:.1f} {low:.1f} {x2:.1f} {arrow_y:.1f}"
            parts.append(
                f'<path class="flow flow-{_esc(arrow.verdict)}" d="{d}" stroke="{colour}" '
                f'marker-end="url(#arrow-{_esc(arrow.finding)})" data-src-zone="{_esc(src)}" '
                f'data-dst-zone="{_esc(dst)}" data-ports="{_esc(" ".join(arrow.ports))}" '
                f'data-policies="{_esc("; ".join(arrow.policies))}"><title>{_esc(arrow.caption)}</title></path>')
        ly = y + top_h
        for arrow, lines in captions:
            colour = COLOURS.get(arrow.finding, "#555")
            for line in lines:
                ly += FLOW_LINE
                parts.append(f'<text class="caption" x="{PAD}" y="{ly - 4}" fill="{colour}">{_esc(line)}</text>')
        parts.append("</g>")
        rows.append("".join(parts))
        y += height
    height = y + PAD
    head = [f'<text class="head" x="{PAD}" y="{HEAD_H - 20}">job</text>']
    for column in columns:
        x = x_of[column]
        head.append(f'<rect class="zone-col{" pending" if column == PENDING else ""}" data-zone="{_esc(column)}" '
                    f'x="{x}" y="0" width="{COL_W}" height="{height}"/>')
        head.append(f'<text class="head" x="{x + PAD}" y="{HEAD_H - 20}">{_esc(column)}</text>')
    markers = "".join(
        f'<marker id="arrow-{kind}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        f'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="{colour}"/></marker>'
        for kind, colour in COLOURS.items())
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="map" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}"><defs>{markers}</defs>{"".join(head)}{"".join(rows)}</svg>')


_STYLE = """
body { font: 14px/1.4 "DejaVu Sans", system-ui, sans-serif; color: #1c1c1c; margin: 24px; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px; }
p.summary { margin: 0 0 16px; color: #444; }
p.summary b.waste { color: #c62828; }
svg.map { display: block; border: 1px solid #ddd; }
svg .zone-col { fill: none; stroke: #e0e0e0; }
svg .zone-col.pending { fill: #fafafa; }
svg .head { font-weight: bold; font-size: 14px; fill: #333; }
svg .row { fill: #fff; stroke: #eee; }
svg .row.odd { fill: #f7f9fc; }
svg .job-kind { font-size: 12px; fill: #666; }
svg .job-name { font-size: 14px; font-weight: bold; fill: #111; }
svg .finding { font-size: 12px; font-weight: bold; }
svg .finding.ok { fill: #2e7d32; }
svg .gpus { font-size: 12px; fill: #444; }
svg .gpus.waste { fill: #c62828; font-weight: bold; }
svg .role { font-size: 12px; font-weight: bold; }
svg .pod { stroke: none; opacity: 0.55; }
svg .pod.gpu { opacity: 1; stroke: #111; stroke-width: 1; }
svg .flow { fill: none; stroke-width: 2.5; stroke-dasharray: 7 4; }
svg .caption { font-size: 12px; }
ul.messages { padding-left: 20px; color: #333; }
"""

# Runs once the browser has laid the page out: counts the arrows drawn with a length, and those whose ends lie in
# the columns of their zones, into <body data-flows-drawn data-flows-placed> (tests read them back).
_CHECK = """
addEventListener("load", () => {
  const column = (zone) => [...document.querySelectorAll("rect.zone-col")].find((r) => r.dataset.zone === zone);
  const inside = (point, rect) =>
    point.x >= rect.x.baseVal.value && point.x <= rect.x.baseVal.value + rect.width.baseVal.value;
  let drawn = 0, placed = 0;
  for (const path of document.querySelectorAll("path.flow")) {
    const length = path.getTotalLength();
    if (length > 0 && path.getBoundingClientRect().width > 0) drawn++;
    const src = column(path.dataset.srcZone), dst = column(path.dataset.dstZone);
    if (src && dst && inside(path.getPointAtLength(0), src) && inside(path.getPointAtLength(length), dst)) placed++;
  }
  document.body.dataset.flowsDrawn = String(drawn);
  document.body.dataset.flowsPlaced = String(placed);
});
"""


def render_html(audits: Sequence[JobAudit], zones: Sequence[str], *, title: str = "topoguard audit") -> str:
    """The page: a summary, the map (render_svg), then every finding's message per job."""
    ordered = sorted(audits, key=lambda a: (_severity(a.worst()), a.namespace, a.kind, a.name))
    broken = [a for a in ordered if a.findings]
    wasted = sum(a.gpus for a in ordered if a.worst() in WASTE)
    summary = (f"{len(ordered)} training job{'s' if len(ordered) != 1 else ''} audited, {len(broken)} with findings. "
               f'<b class="{"waste" if wasted else "none"}">{wasted} GPU{"s" if wasted != 1 else ""} '
               'held by blocked or split jobs</b>: '
               f"{wasted} GPU-hour{'s' if wasted != 1 else ''} wasted every hour they stay so.<br>"
               "Squares are pods (outlined: holding GPUs), in the zone their node is in; a dashed arrow is a flow "
               "the job needs that policy denies, from the source pods' zone to the destination's.")
    messages = "".join(
        f"<li><b>{_esc(a.ref)}</b><ul>" + "".join(f"<li>{_esc(f.type)}: {_esc(f.message)}</li>" for f in a.findings)
        + "</ul></li>" for a in broken)
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title><style>{_STYLE}</style></head>\n'
        f"<body><h1>{_esc(title)}</h1><p class=\"summary\">{summary}</p>\n{render_svg(ordered, zones)}\n"
        f'<ul class="messages">{messages}</ul>\n<script>{_CHECK}</script></body></html>\n'
    )
