"""Command line: `topoguard serve | review | explain | reach | audit` and `--version` (DESIGN.md "Contracts").

Thin: declares the arguments (the contract) and dispatches to app.commands.<name>.run, imported
lazily so `reach` and `review` start without loading the web stack.

A reader that goes away early (`topoguard reach ... -o json | head -3`) ends the command quietly
with exit 141 (128 + SIGPIPE, what a shell reports for a writer killed by SIGPIPE): not 0, which
`reach` uses for "allow", and distinct from every verdict and usage code, so a script running with
`set -o pipefail` sees that the output was cut.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from app import __version__

EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE


def _add_common(p: argparse.ArgumentParser, *, cluster_required: bool) -> None:
    p.add_argument("--cluster", required=cluster_required, metavar="PATH",
                   help="cluster snapshot: YAML/JSON file (multi-document or List) or a directory of them")
    p.add_argument("--config", metavar="FILE", help="settings file (camelCase keys, as the chart's config: values)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="topoguard",
        description="Keep distributed training jobs in one zone whose network paths are open.",
    )
    parser.add_argument("--version", action="version", version=f"topoguard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the admission webhook over HTTPS")
    _add_common(serve, cluster_required=False)
    serve.add_argument("--kubeconfig", metavar="PATH", help="watch a cluster through this kubeconfig")
    serve.add_argument("--tls-cert", metavar="FILE")
    serve.add_argument("--tls-key", metavar="FILE")
    serve.add_argument("--tls-client-ca", metavar="FILE", help="require client certificates signed by this CA")
    serve.add_argument("--self-signed", action="store_true", help="generate a certificate in memory (demos, tests)")
    serve.add_argument("--host", default="0.0.0.0")
    serve.add_argument("--port", type=int, default=8443)
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])

    review = sub.add_parser("review", help="answer one AdmissionReview exactly as the server would")
    _add_common(review, cluster_required=True)
    review.add_argument("--operation", choices=["mutate", "validate"], default="mutate")
    review.add_argument("file", nargs="?", default="-", metavar="FILE|-")

    explain = sub.add_parser("explain", help="the per-zone map for one job: GPUs, flows, the choice, the patch")
    explain.add_argument("job", metavar="JOB.yaml")
    _add_common(explain, cluster_required=True)
    explain.add_argument("-o", "--output", choices=["text", "json"], default="text")

    reach = sub.add_parser("reach", help="one flow's verdict under the cluster's network policies")
    _add_common(reach, cluster_required=True)
    reach.add_argument("--from", dest="src", required=True, metavar="NS/POD|NS:k=v,...")
    reach.add_argument("--to", dest="dst", required=True, metavar="NS/POD|NS:k=v,...")
    reach.add_argument("--port", required=True, metavar="PORT[-END][/TCP|UDP|SCTP|ANY]",
                       help="a port or an inclusive range (30000-32767); protocol TCP unless given")
    reach.add_argument("--policy-enforcement", choices=["default", "always", "never"])
    reach.add_argument("-o", "--output", choices=["text", "json"], default="text")

    audit = sub.add_parser("audit", help="the running training jobs: split, blocked or closed zones")
    _add_common(audit, cluster_required=True)
    audit.add_argument("-o", "--output", choices=["text", "json"], default="text")
    audit.add_argument("--scope", choices=["opted-in", "all"],
                       help="jobs of opted-in namespaces (default: the audit.scope setting) or of all")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    module = importlib.import_module(f"app.commands.{args.command}")
    try:
        code: int = module.run(args)
        sys.stdout.flush()  # inside the try: a pipe closed early fails here, not at interpreter exit
    except BrokenPipeError:
        # Python ignores SIGPIPE and raises instead. As the `signal` module's docs advise, point stdout
        # at devnull so the interpreter's own final flush cannot raise (and print) again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return code


if __name__ == "__main__":
    sys.exit(main())
