"""`topoguard review --cluster PATH [--operation mutate|validate] [--config F] [FILE|-]`.

Reads one AdmissionReview (a file or stdin), answers it with the server's own pipeline
(`admission.parse_review` → `admission.answer`) against the file snapshot, and prints the response
AdmissionReview encoded exactly as the server sends it. Exit 0 whenever it answered, allowed or
not; 2 when the input is unusable (unreadable file, bad JSON, not an AdmissionReview, unreadable
snapshot or config), with the reason on stderr and nothing on stdout.

NB: the file snapshot is complete by construction, so no cache problem is ever passed on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

from app.cache.files import SnapshotError, load_snapshot
from app.config import ConfigError, load_settings
from app.http import admission

EXIT_ANSWERED = 0
EXIT_USAGE = 2


class _Unusable(Exception):
    pass


def _read_review(source: str) -> Any:
    try:
        data = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
    except OSError as e:
        raise _Unusable(f"cannot read {source}: {e.strerror or e}") from e
    where = "stdin" if source == "-" else source
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise _Unusable(f"{where} is not valid JSON: {e}") from e


def run(args: argparse.Namespace) -> int:
    try:
        body = _read_review(args.file)
        request = admission.parse_review(body)
        settings = load_settings(args.config)
        snapshot = load_snapshot(args.cluster, cilium_config=settings.cilium_config)
    except admission.BadReview as e:
        print(f"topoguard review: not a usable AdmissionReview: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (_Unusable, ConfigError, SnapshotError) as e:
        print(f"topoguard review: {e}", file=sys.stderr)
        return EXIT_USAGE
    outcome = admission.answer(request, snapshot=snapshot, settings=settings, operation=args.operation)
    sys.stdout.buffer.write(orjson.dumps(outcome.review) + b"\n")
    sys.stdout.flush()
    return EXIT_ANSWERED
