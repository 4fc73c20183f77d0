"""Cilium + Kubernetes NetworkPolicy reachability: can pod A open a connection to pod B on port P?

The public API (other packages import only these names):

- `build_index(snapshot)`: every policy compiled once per snapshot (memoized on it).
- `check_flow(snapshot, src, dst, ports, protocol, *, enforcement)`: the verdict with reasons.
- `endpoint_for_pod(snapshot, pod)`: an existing pod as policy sees it.
- `label_keys_mentioned(snapshot)`: every label key a policy selector names.
- `policy_problems(snapshot)`: (policy, problem) for invalid, unsupported or questionable policies.

Pure: no I/O, no Kubernetes client. The semantics follow research/cilium-semantics.md; each module
names the sections it implements.
"""

from app.policy.identity import endpoint_for_pod
from app.policy.index import PolicyIndex, build_index, label_keys_mentioned, policy_problems
from app.policy.verdicts import check_flow

__all__ = [
    "PolicyIndex",
    "build_index",
    "check_flow",
    "endpoint_for_pod",
    "label_keys_mentioned",
    "policy_problems",
]
