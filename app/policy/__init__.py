"""Cilium, Kubernetes NetworkPolicy and ClusterNetworkPolicy reachability: can pod A reach pod B on port P?

The public API (other packages import only these names):

- `build_index(snapshot)`: every policy compiled once per snapshot (memoized on it); `build_index_after`
  the same for a snapshot that changes a few of another's policies (a what-if), from that one's index.
- `check_flow(snapshot, src, dst, ports, protocol, *, enforcement)`: the verdict with reasons,
  memoized per snapshot; `evaluate_flow` (same arguments) computes it afresh.
- `endpoint_for_pod(snapshot, pod)`: an existing pod as policy sees it.
- `label_keys_mentioned(snapshot)`: every label key a policy selector names.
- `label_values_mentioned(snapshot, key)`: the values selectors compare one label key against.
- `policy_problems(snapshot)`: (policy, problem) for invalid, unsupported or questionable policies.

Pure: no I/O, no Kubernetes client. The semantics follow research/cilium-semantics.md; each module
names the sections it implements.

The agent's version and settings (`app.policy.agent`, a `CiliumAgent`: the snapshot's cilium-config
and agent image, topoguard's settings winning) decide the identity label filter, the cluster name,
policy-enforcement, audit mode, `enableDefaultDeny` (honoured from 1.16 with
`enable-non-default-deny-policies`), `policy-cidr-match-mode` (pods: CIDR peers against the zone's
pod CIDRs) and which policy kinds are enforced (ClusterNetworkPolicy from 1.20, behind
`enable-k8s-cluster-network-policy`; a kind whose enforcement is not known makes the verdicts it
changes `unknown`).

What the evaluator still assumes about the cluster (none of it is in the snapshot):

- the L7 proxy enabled, the default `policy-entity-selectors`; FQDN and node peers never match a pod.
- `fromNodes`/`toNodes` policies are valid (`enable-node-selector-labels` on); they match no pod.
- `allow-localhost` at its default: a pod's own node may always reach it (unless denied).
- A hostNetwork pod's traffic carries entity `host` on its own node and `remote-node` elsewhere;
  where pods will run is not known, so a pod's side toward one must agree for both. Its own side
  is host traffic: not enforced without host policies (CCNP `nodeSelector`), else `unknown`.
- Anything whose outcome depends on the Cilium version or on objects the snapshot lacks is
  `unknown`, never guessed: `fromRequires`/`toRequires` (removed in 1.19), namespace-label peers
  of a CNP across namespaces, `toServices`, L7 / authentication / listener conditions, host
  policies, node labels of node identities, and policies Cilium rejects as invalid or that carry
  unknown fields — those make every side they may select `unknown` (an explicit deny from a valid
  policy still wins).

Module map: `selectors` (label selectors, peer scoping), `identity` (a pod's identity labels),
`ports` (port sets and interval arithmetic), `cidrs` (CIDR peers against pod addresses), `rules`
(compiled types), `cilium`, `knp` and `kcnp` (compilers and validation), `tiers` (ClusterNetworkPolicy
precedence), `agent` (the agent's settings), `index` (per-snapshot index), `verdicts` (`check_flow`).
"""

from app.policy.identity import endpoint_for_pod
from app.policy.index import (
    PolicyIndex,
    build_index,
    build_index_after,
    compiled_policy,
    label_keys_mentioned,
    label_values_mentioned,
    policy_problems,
)
from app.policy.verdicts import check_flow, evaluate_flow, snapshot_agent

__all__ = [
    "PolicyIndex",
    "build_index",
    "build_index_after",
    "check_flow",
    "compiled_policy",
    "endpoint_for_pod",
    "evaluate_flow",
    "label_keys_mentioned",
    "label_values_mentioned",
    "policy_problems",
    "snapshot_agent",
]
