"""Command line: `topoguard serve | review | explain | reach | audit | what-if` and `--version` (DESIGN.md "Contracts").

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
import textwrap
from collections.abc import Sequence
from typing import Any

from app import __version__

EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written (exit codes, examples), and every option's default shown."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "(default" in text:
            return text
        return f"{text} (default: %(default)s)"


def _add_parser(
    sub: Any, name: str, *, help: str, description: str, codes: str, example: str
) -> argparse.ArgumentParser:
    epilog = f"exit codes:\n{codes}\n\nexample:\n  {example}"
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help, description=textwrap.fill(description, 100), epilog=epilog, formatter_class=_HelpFormatter)
    return parser


def _add_common(p: argparse.ArgumentParser, *, cluster_required: bool) -> None:
    p.add_argument("--cluster", required=cluster_required, metavar="PATH",
                   help="cluster snapshot: YAML/JSON file (multi-document or List) or a directory of them; "
                        "files in a directory that are not Kubernetes objects are skipped with a note")
    p.add_argument("--config", metavar="FILE",
                   help="settings file (camelCase keys, as the chart's config: values); TOPOGUARD_* variables "
                        "override it")


def add_serve(sub: Any) -> None:
    serve = _add_parser(
        sub, "serve", help="run the admission webhook over HTTPS",
        description="Run the admission webhook: POST /mutate and /validate, /healthz, /readyz, /metrics. "
                    "Watches the cluster through --kubeconfig (or in-cluster), or serves a fixed --cluster "
                    "snapshot.",
        codes="  0  stopped cleanly (SIGTERM/SIGINT)\n  2  unusable configuration, certificate, snapshot or port",
        example="topoguard serve --cluster examples/lab-cluster.yaml --self-signed --port 8443")
    _add_common(serve, cluster_required=False)
    serve.add_argument("--kubeconfig", metavar="PATH", help="watch a cluster through this kubeconfig")
    serve.add_argument("--tls-cert", metavar="FILE", help="server certificate (PEM), reloaded when it changes")
    serve.add_argument("--tls-key", metavar="FILE", help="its private key (PEM)")
    serve.add_argument("--tls-client-ca", metavar="FILE", help="require client certificates signed by this CA")
    serve.add_argument("--self-signed", action="store_true", help="generate a certificate in memory (demos, tests)")
    serve.add_argument("--host", default="0.0.0.0", help="address to listen on")
    serve.add_argument("--port", type=int, default=8443, help="port to listen on")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                       help="log level (JSON lines on stderr)")


def add_review(sub: Any) -> None:
    review = _add_parser(
        sub, "review", help="answer one AdmissionReview (or a job manifest) exactly as the server would",
        description="Answer one AdmissionReview v1 with the webhook's own pipeline and print the response "
                    "AdmissionReview. A plain job manifest (YAML or JSON) is wrapped in the AdmissionReview the "
                    "apiserver would send for creating it (CREATE, the job's namespace, a uid derived from the "
                    "file, a placeholder user).",
        codes="  0  answered (allowed or not: read response.allowed)\n"
              "  2  unusable input: unreadable file, not an AdmissionReview or job, bad snapshot or config",
        example="topoguard review --cluster examples/lab-cluster.yaml --config examples/config.yaml "
                "examples/pytorchjob-lab.yaml")
    _add_common(review, cluster_required=True)
    review.add_argument("--operation", choices=["mutate", "validate", "validate-policy"], default="mutate",
                        help="answer as the mutating or the validating webhook, or as the policy-change webhook "
                             "(POST /validate-policy; FILE is then a policy manifest or its review)")
    review.add_argument("file", nargs="?", default="-", metavar="FILE|-",
                        help="AdmissionReview JSON or job manifest; - reads standard input")


def add_explain(sub: Any) -> None:
    explain = _add_parser(
        sub, "explain", help="the per-zone map for one job: GPUs, flows, the choice, the patch",
        description="Run the webhook's engine on one job and a snapshot: the verdict and smallest fix first, "
                    "then per zone the GPUs, capacity, every required flow's verdict with the policies behind "
                    "it, the chosen zone and the JSON Patch. Says first when the webhook would not review the "
                    "job (namespace not opted in).",
        codes="  0  a zone was chosen\n  1  no zone works (the reasons are printed)\n"
              "  2  unusable input: unreadable file, not one job, unsupported kind, bad job, config or snapshot",
        example="topoguard explain examples/pytorchjob-lab.yaml --cluster examples/lab-cluster.yaml")
    explain.add_argument("job", metavar="JOB.yaml", help="the job manifest (one object; - reads standard input)")
    _add_common(explain, cluster_required=True)
    explain.add_argument("-o", "--output", choices=["text", "json"], default="text", help="output format")


def add_reach(sub: Any) -> None:
    reach = _add_parser(
        sub, "reach", help="one flow's verdict under the cluster's network policies",
        description="Whether a connection from one pod to another on a port is allowed by the snapshot's "
                    "CiliumNetworkPolicies, CiliumClusterwideNetworkPolicies and NetworkPolicies, with the "
                    "policy and rule behind each side (egress of the source, ingress of the destination).",
        codes="  0  allow\n  1  deny\n  3  unknown (cannot be evaluated)\n  2  usage error",
        example="topoguard reach --cluster examples/lab-cluster.yaml --from ml-demo:zone=zone-a "
                "--to ml-demo:zone=zone-b --port 23456")
    _add_common(reach, cluster_required=True)
    reach.add_argument("--from", dest="src", required=True, metavar="NS/POD|NS:k=v,...",
                       help="the source: a pod of the snapshot, or the labels of a pod not created yet")
    reach.add_argument("--to", dest="dst", required=True, metavar="NS/POD|NS:k=v,...", help="the destination")
    reach.add_argument("--port", required=True, metavar="PORT[-END][/TCP|UDP|SCTP|ANY]",
                       help="a port or an inclusive range (30000-32767); protocol TCP unless given")
    reach.add_argument("--policy-enforcement", choices=["default", "always", "never"],
                       help="Cilium's policy enforcement mode (default: the settings' policyEnforcement)")
    reach.add_argument("-o", "--output", choices=["text", "json"], default="text", help="output format")


def add_audit(sub: Any) -> None:
    audit = _add_parser(
        sub, "audit", help="the running training jobs: split, blocked or closed zones",
        description="Audit the training jobs a snapshot holds (taken with kubectl get, jobs and pods included): "
                    "for each, the zones of its bound pods, its pending pods, and the flows between its actual "
                    "pods under the current policies, with the admission engine. Findings: split, blocked, "
                    "unknown, zone-closed; one line per job with findings leads the text output.",
        codes="  0  nothing found\n  1  findings\n  2  unusable input: bad snapshot or config",
        example="topoguard audit --cluster cluster.yaml -o json")
    _add_common(audit, cluster_required=True)
    audit.add_argument("-o", "--output", choices=["text", "json", "html"], default="text",
                       help="output format (html: a self-contained page mapping jobs' pods and blocked flows to zones)")
    audit.add_argument("--scope", choices=["opted-in", "all"],
                       help="jobs of opted-in namespaces or of all (default: the audit.scope setting)")


def add_what_if(sub: Any) -> None:
    what_if = _add_parser(
        sub, "what-if", help="a network-policy change judged against the running training jobs",
        description="Judge a policy change before it lands: apply (create or replace) the CiliumNetworkPolicy, "
                    "CiliumClusterwideNetworkPolicy, NetworkPolicy, ClusterNetworkPolicy and CiliumCIDRGroup "
                    "objects of files or directories (other kinds are listed as ignored) and delete objects, on "
                    "a snapshot, and list the training jobs whose required flows change, each flow before and "
                    "after with the policy and rule that decide it.",
        codes="  0  no job in scope loses a required flow\n  1  at least one would\n"
              "  3  none would, some verdicts become unknown\n"
              "  2  unusable input: bad snapshot, manifest, reference or config",
        example="topoguard what-if --cluster cluster.yaml --apply policies/ -o markdown")
    _add_common(what_if, cluster_required=False)
    what_if.add_argument("--kubeconfig", metavar="PATH",
                         help="without --cluster: take the snapshot from the live cluster through this kubeconfig "
                              "(default: in-cluster), with the watch cache serve runs")
    what_if.add_argument("--sync-timeout", type=float, default=60.0, metavar="SECONDS",
                         help="without --cluster: how long the cache may take to list the cluster")
    what_if.add_argument("--apply", action="append", metavar="FILE|DIR",
                         help="policy objects to create or replace (repeatable)")
    what_if.add_argument("--delete", action="append", metavar="KIND/NAME|KIND/NAMESPACE/NAME",
                         help="an object to delete (repeatable; KIND also as cnp, ccnp, netpol)")
    what_if.add_argument("-o", "--output", choices=["text", "json", "markdown"], default="text",
                         help="output format (markdown: a pull-request comment)")


# One function per subcommand: adding a command is adding a function and a line here.
SUBCOMMANDS = (add_serve, add_review, add_explain, add_reach, add_audit, add_what_if)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="topoguard",
        description="Keep distributed training jobs in one zone whose network paths are open.",
        epilog="`topoguard COMMAND --help` describes each command, its defaults, exit codes and an example.",
    )
    parser.add_argument("--version", action="version", version=f"topoguard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    module = importlib.import_module(f"app.commands.{args.command.replace('-', '')}")
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
