"""`topoguard what-if (--cluster PATH | [--kubeconfig PATH]) [--apply FILE|DIR]... [--delete REF]... [--config F]
[-o text|json|markdown]`.

A network-policy change judged against the training jobs of a snapshot before it lands (DESIGN.md "Round 3",
What-if; app/engine/whatif.py). `--apply` creates or replaces the policy objects of files or directories
(other kinds are listed as ignored); `--delete` takes `KIND/NAME` (cluster-scoped kinds) or
`KIND/NAMESPACE/NAME`. Exit 0: no job in scope loses a required flow; 1: at least one would; 3: none would,
some verdicts become `unknown`; 2: bad input. JSON: `WhatIf.to_json()` plus `ignored`; `-o markdown` is a
pull-request comment. Without `--cluster` the snapshot is the live cluster's, taken once by the watch cache.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from app.cache import projections
from app.cache.errors import CacheError, CacheNotReadyError
from app.cache.files import SnapshotError, load_snapshot, read_objects
from app.config import ConfigError, Settings, load_settings
from app.engine.whatif import CHANGE_KINDS, CIDR_GROUP_KIND, CLUSTER_SCOPED_KINDS, Change, ChangeError, WhatIf, what_if
from app.models.cluster import Snapshot

EXIT_CLEAN = 0
EXIT_BREAKS = 1
EXIT_USAGE = 2
EXIT_UNKNOWN = 3
EXIT_CODES = {"clean": EXIT_CLEAN, "breaks": EXIT_BREAKS, "unknown": EXIT_UNKNOWN}

# What --delete accepts for a kind: the kind, its plural resource name and kubectl's short names, any case.
_NAMES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("CiliumNetworkPolicy", ("ciliumnetworkpolicies", "cnp", "ciliumnp")),
    ("CiliumClusterwideNetworkPolicy", ("ciliumclusterwidenetworkpolicies", "ccnp")),
    ("NetworkPolicy", ("networkpolicies", "netpol")),
    ("ClusterNetworkPolicy", ("clusternetworkpolicies",)),
    ("CiliumCIDRGroup", ("ciliumcidrgroups", "ccg")),
)
KIND_NAMES: dict[str, str] = {name.lower(): kind for kind, names in _NAMES for name in (kind, *names)}


class UsageError(ValueError):
    pass


def parse_delete(ref: str) -> Change:
    """`KIND/NAME` (cluster-scoped kinds) or `KIND/NAMESPACE/NAME` → a delete."""
    parts = ref.split("/")
    kind = KIND_NAMES.get(parts[0].lower()) if parts else None
    if kind is None:
        raise UsageError(f"--delete {ref}: unknown kind {parts[0]!r}; one of {', '.join(CHANGE_KINDS)} "
                         "(or cnp, ccnp, netpol)")
    if any(not p for p in parts) or len(parts) not in (2, 3):
        raise UsageError(f"--delete {ref}: expected KIND/NAME or KIND/NAMESPACE/NAME")
    if kind in CLUSTER_SCOPED_KINDS and len(parts) != 2:
        raise UsageError(f"--delete {ref}: {kind} is cluster-scoped: {parts[0]}/NAME")
    if kind not in CLUSTER_SCOPED_KINDS and len(parts) != 3:
        raise UsageError(f"--delete {ref}: {kind} is namespaced: {parts[0]}/NAMESPACE/NAME")
    return Change.delete(kind, parts[1] if len(parts) == 3 else "", parts[-1])


def read_applies(paths: Sequence[str]) -> tuple[list[Change], list[dict[str, str]]]:
    """The changes of the policy objects in `paths` (in order), and every other object as ignored."""
    changes: list[Change] = []
    ignored: list[dict[str, str]] = []
    for path in paths:
        for where, obj in read_objects(path):
            kind = str(obj.get("kind", ""))
            meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
            name = str((meta or {}).get("name") or "")
            if kind not in CHANGE_KINDS:
                namespace = str((meta or {}).get("namespace") or "")
                ignored.append({"kind": kind, "namespace": namespace, "name": name, "source": where})
                continue
            if not name:
                raise UsageError(f"{where}: {kind} has no metadata.name")
            if kind == CIDR_GROUP_KIND:
                changes.append(Change.apply(projections.project_cidr_group(obj)))
            else:
                changes.append(Change.apply(projections.project_policy(obj)))
    return changes, ignored


# --- output -----------------------------------------------------------------------------------


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _totals(result: WhatIf) -> str:
    s = result.summary()
    text = (f"{_plural(s['jobsChecked'], 'training job')} checked ({s['jobsJudged']} within the change's reach): "
            f"{s['jobsBroken']} would break, {s['jobsUnknown']} would become unknown")
    if s["jobsWithoutPods"]:
        text += (f"; {_plural(s['jobsWithoutPods'], 'job')} without pods yet not judged (admission checks them "
                 "when their pods are created)")
    return text


def _state(job: Any) -> str:
    return "BREAKS" if job.broken else ("UNKNOWN" if job.unknown else "changes")


def render_text(result: WhatIf, ignored: Sequence[dict[str, str]]) -> str:
    lines = [f"{c.action} {c.ref}" for c in result.changes]
    for item in ignored:
        ref = f"{item['namespace']}/{item['name']}" if item["namespace"] else item["name"]
        lines.append(f"ignored {item['kind']} {ref} ({item['source']}): not a policy kind")
    lines.append("")
    for job in result.jobs:
        lines.append(f"{job.ref}: {_state(job)}")
        for flow in job.flows:
            lines.append(f"  {flow.describe()}")
        lines.append("")
    lines.append(_totals(result))
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(result: WhatIf, ignored: Sequence[dict[str, str]]) -> str:
    """A pull-request comment: the verdict first, the changes, then one table per job whose flows change."""
    headline = {
        "breaks": f"⛔ {_plural(len(result.broken), 'training job')} would lose a required connection",
        "unknown": f"⚠️ {_plural(len(result.unknown), 'training job')} would have connections topoguard cannot judge",
        "clean": "✅ no training job loses a required connection",
    }[result.outcome]
    lines = [f"### topoguard what-if: {headline}", "", "| change | object |", "|---|---|"]
    lines += [f"| {c.action} | {_cell(c.ref)} |" for c in result.changes]
    for item in ignored:
        ref = f"{item['namespace']}/{item['name']}" if item["namespace"] else item["name"]
        lines.append(f"| ignored (not a policy) | {_cell(item['kind'] + ' ' + ref)} |")
    for job in result.jobs:
        lines += ["", f"**{_cell(job.ref)}**: {_state(job).lower()}", "",
                  "| from | to | port | purpose | before | after | decided by |", "|---|---|---|---|---|---|---|"]
        for f in job.flows:
            after = f"**{f.after}**" if f.breaks or f.after == "unknown" else f.after
            by = " ".join(p for p in (f.policy, f.rule) if p) or "; ".join(f.reasons) or "no policy (not enforced)"
            lines.append(f"| {f.flow.src} | {f.flow.dst} | {f.port} | {f.flow.purpose} | {f.before} | {after} | "
                         f"{_cell(by)} |")
    lines += ["", f"<sub>{_cell(_totals(result))}.</sub>"]
    return "\n".join(lines) + "\n"


def to_json(result: WhatIf, ignored: Sequence[dict[str, str]]) -> dict[str, Any]:
    return {**result.to_json(), "ignored": list(ignored)}


def live_snapshot(settings: Settings, kubeconfig: str | None, timeout: float) -> Snapshot:
    """One snapshot of the live cluster, taken by the watch cache `topoguard serve` runs (the same lists,
    projections and snapshot), then stopped: `--kubeconfig`, else the in-cluster config.

    Raises:
        CacheError: no client can be configured, or the cache did not sync within `timeout` seconds.
    """
    from app.cache.watchers import WatchStore  # the kubernetes client loads only when watching

    store = WatchStore(settings, kubeconfig=kubeconfig)

    async def take() -> Snapshot:
        await store.start()
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    return store.snapshot()
                except CacheNotReadyError as e:
                    if time.monotonic() > deadline:
                        raise CacheNotReadyError(f"{e} after {timeout:g}s (--sync-timeout)") from None
                await asyncio.sleep(0.1)
        finally:
            await store.stop()

    return asyncio.run(take())


def run(args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out, err = stdout or sys.stdout, stderr or sys.stderr
    try:
        if not args.apply and not args.delete:
            raise UsageError("nothing to judge: give --apply FILE|DIR or --delete KIND/[NAMESPACE/]NAME")
        settings = load_settings(args.config)
        changes, ignored = read_applies(args.apply or [])
        changes += [parse_delete(ref) for ref in args.delete or []]
        if args.cluster and args.kubeconfig:
            raise UsageError("--cluster and --kubeconfig are mutually exclusive")
        if args.cluster:
            snapshot = load_snapshot(args.cluster, gpu_resources=settings.gpu_resources,
                                     cilium_config=settings.cilium_config)
        else:
            snapshot = live_snapshot(settings, args.kubeconfig, args.sync_timeout)
        result = what_if(snapshot, settings, changes)
    except (ConfigError, SnapshotError, UsageError, ChangeError, CacheError) as e:
        print(f"topoguard what-if: {e}", file=err)
        return EXIT_USAGE
    if args.output == "json":
        json.dump(to_json(result, ignored), out, indent=2, ensure_ascii=False)
        out.write("\n")
    elif args.output == "markdown":
        out.write(render_markdown(result, ignored))
    else:
        out.write(render_text(result, ignored))
    return EXIT_CODES[result.outcome]
