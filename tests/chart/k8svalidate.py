"""Validate rendered chart objects against the Kubernetes OpenAPI schemas (kubernetes-validate).

Run by hack/chart-lint.sh: `python tests/chart/k8svalidate.py -k 1.30.0 -k 1.37.0 FILE...`.
Strict mode rejects unknown fields, so a mistyped key fails here instead of being pruned silently
by the apiserver. Kinds backed by CRDs the schema bundle cannot know (prometheus-operator, Cilium,
cert-manager) are skipped with a printed note; any other kind without a schema is an error.
Exit 0 when every object passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

CRD_GROUPS = ("monitoring.coreos.com", "cilium.io", "cert-manager.io")


def iter_objects(path: Path) -> Iterator[dict[str, Any]]:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc is None:
            continue
        if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
            raise SystemExit(f"{path}: a document is not a Kubernetes object: {str(doc)[:80]!r}")
        yield doc


def validate_file(path: Path, versions: list[str]) -> tuple[int, int, int]:
    """Validate every object in `path`; returns (passed, skipped, failed)."""
    passed = skipped = failed = 0
    for obj in iter_objects(path):
        name = f"{obj['kind']}/{obj.get('metadata', {}).get('name', '?')}"
        group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
        if group in CRD_GROUPS:
            print(f"  note: {path.name}: {name} ({obj['apiVersion']}) is CRD-backed; no built-in schema, skipped")
            skipped += 1
            continue
        ok = True
        for version in versions:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                path_str = "/".join(str(p) for p in e.path)
                print(f"  FAIL: {path.name}: {name} against {version}: {e.message} at /{path_str}")
                ok = False
            except kubernetes_validate.SchemaNotFoundError as e:
                print(f"  FAIL: {path.name}: {name}: {e}")
                ok = False
        passed += ok
        failed += not ok
    return passed, skipped, failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", "--kubernetes-version", action="append", dest="versions", required=True)
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    total = [0, 0, 0]
    for path in args.files:
        counts = validate_file(path, args.versions)
        total = [a + b for a, b in zip(total, counts, strict=True)]
    print(f"kubernetes-validate --strict ({', '.join(args.versions)}): "
          f"{total[0]} objects valid, {total[1]} CRD-backed skipped, {total[2]} invalid")
    return 1 if total[2] else 0


if __name__ == "__main__":
    sys.exit(main())
