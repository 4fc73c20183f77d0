"""Differential test: every case through topoguard's policy code and through Cilium's (the oracle).

    .venv/bin/python hack/oracle/compare.py --oracle hack/oracle/.bin/oracle [--generated 600] [--seed 14]

Exit 0 when every case agrees or its disagreement is listed in known-differences.yaml; 1 otherwise
(each disagreement printed with both answers); 2 when the oracle fails. The oracle answers allow or
deny only; topoguard's `unknown` agrees with neither, so a case where topoguard says `unknown`
passes only through a known-differences entry naming a behaviour that cannot be evaluated offline.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from cases import Generator, table_cases  # noqa: E402

from app.cache.files import build_snapshot  # noqa: E402
from app.models.cilium import CiliumAgent, parse_version  # noqa: E402
from app.models.cluster import ContainerPort  # noqa: E402
from app.models.network import Endpoint, PortRange  # noqa: E402
from app.policy import check_flow  # noqa: E402

# The Cilium release the oracle is built from (hack/oracle/go.mod); topoguard is asked as for it.
_PIN = re.search(r"github\.com/cilium/cilium (v[0-9.]+)", (HERE / "go.mod").read_text())
ORACLE_VERSION = parse_version(_PIN.group(1)) if _PIN else None
GENERATED_KINDS = ("CiliumNetworkPolicy", "CiliumClusterwideNetworkPolicy", "NetworkPolicy", "ClusterNetworkPolicy")


def topoguard_verdict(case: Mapping[str, Any]) -> tuple[str, list[str]]:
    """topoguard's answer: the verdict and its reasons' messages."""
    namespaces = {}
    for side in (case["src"], case["dst"]):
        namespaces[side["namespace"]] = side["namespaceLabels"]
    objects = [*case["policies"], *(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n, "labels": labels}}
        for n, labels in namespaces.items()
    )]
    snapshot = build_snapshot(objects)
    src, dst = (_endpoint(case[k], k) for k in ("src", "dst"))
    settings = case["settings"]
    # The oracle parses every ClusterNetworkPolicy it is given, as an agent with
    # enable-k8s-cluster-network-policy=true does.
    agent = CiliumAgent(version=ORACLE_VERSION, cluster_name=settings.get("clusterName") or "default",
                        labels=tuple(settings.get("labels") or ()), kinds_unknown=())
    verdict = check_flow(snapshot, src, dst, PortRange(case["first"], case["last"]), case["protocol"],
                         enforcement=settings.get("policyEnforcement", "default"), agent=agent)
    return verdict.verdict, [r.message for r in verdict.reasons]


def _endpoint(pod: Mapping[str, Any], name: str) -> Endpoint:
    return Endpoint(
        namespace=pod["namespace"],
        labels=dict(pod["labels"]),
        namespace_labels=dict(pod["namespaceLabels"]),
        service_account=pod.get("serviceAccountName") or "default",
        ports=tuple(ContainerPort(p["containerPort"], p.get("protocol", "TCP"), p.get("name", ""))
                    for p in pod.get("containerPorts") or []),
        name=name,
    )


def oracle_verdicts(binary: Path, cases: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    wire = "".join(json.dumps({k: c[k] for k in ("name", "policies", "src", "dst", "ports", "protocol", "settings")})
                   + "\n" for c in cases)
    done = subprocess.run([str(binary)], input=wire, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"oracle failed ({done.returncode}): {done.stderr.strip()}")
    answers = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    if len(answers) != len(cases):
        raise SystemExit(f"oracle answered {len(answers)} of {len(cases)} cases")
    return answers


def known_entry(known: Sequence[Mapping[str, Any]], case: Mapping[str, Any], ours: str,
                theirs: str) -> Mapping[str, Any] | None:
    """The known-differences entry that covers this disagreement, if any."""
    for entry in known:
        if entry.get("topoguard", "unknown") != ours:
            continue
        if entry.get("cilium", "any") not in ("any", theirs):
            continue
        if "feature" in entry and entry["feature"] not in case["features"]:
            continue
        if "case" in entry and not fnmatch.fnmatchcase(case["name"], entry["case"]):
            continue
        return entry
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--oracle", type=Path, default=HERE / ".bin" / "oracle")
    parser.add_argument("--generated", type=int, default=600)
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--known", type=Path, default=HERE / "known-differences.yaml")
    parser.add_argument("--dump", type=Path, help="write every case with both answers here (JSON lines)")
    args = parser.parse_args(argv)

    known = (yaml.safe_load(args.known.read_text()) or []) if args.known.exists() else []
    for entry in known:
        if not entry.get("reason") or entry.get("topoguard", "unknown") != "unknown":
            raise SystemExit(f"known difference {entry!r}: needs a reason, and topoguard must answer unknown")
    cases = [*table_cases(), *Generator(args.seed, kinds=GENERATED_KINDS).cases(args.generated)]
    answers = oracle_verdicts(args.oracle, cases)

    tally: Counter[str] = Counter()
    failures = []
    dump = args.dump.open("w") if args.dump else None
    for case, answer in zip(cases, answers, strict=True):
        if answer["verdict"] == "error":
            failures.append(f"{case['name']}: the oracle could not answer: {answer.get('error')}")
            continue
        if answer.get("rejected"):
            case["features"] = sorted({*case["features"], "rejected-by-cilium"})
        ours, reasons = topoguard_verdict(case)
        theirs = answer["verdict"]
        if dump:
            dump.write(json.dumps({**case, "topoguard": ours, "reasons": reasons, "cilium": answer}) + "\n")
        if ours == theirs:
            tally["agree"] += 1
            continue
        entry = known_entry(known, case, ours, theirs)
        if entry is not None:
            tally[f"known: {entry['reason']}"] += 1
            continue
        failures.append(
            f"{case['name']} ({', '.join(case['features'])}): topoguard {ours}, Cilium {theirs} "
            f"(egress {answer['egress']}, ingress {answer['ingress']}; denied {answer.get('denied') or '-'}; "
            f"rejected {answer.get('rejected') or '-'})\n    topoguard: " + "\n    topoguard: ".join(reasons)
        )
    if dump:
        dump.close()
    tables = sum(1 for c in cases if "table" in c["features"])
    print(f"oracle: {len(cases)} cases ({tables} from the test tables, {len(cases) - tables} generated, "
          f"seed {args.seed}); {tally['agree']} agree, {len(failures)} disagree")
    for label, count in sorted(tally.items()):
        if label != "agree":
            print(f"  {count:4d} {label}")
    for failure in failures:
        print(f"DISAGREE {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
