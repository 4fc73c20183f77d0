"""Every label, annotation and well-known key topoguard reads or writes, in one place."""

from __future__ import annotations

# Namespace opt-in and per-namespace overrides.
ENABLED_LABEL = "topoguard.io/enabled"
ENFORCEMENT_LABEL = "topoguard.io/enforcement"
# Per-job opt-out: the job's annotation asks, the namespace's label allows (docs/operations.md "Opting a job out").
SKIP_ANNOTATION = "topoguard.io/skip"
ALLOW_SKIP_LABEL = "topoguard.io/allow-skip"
# Per job: the TCP ports its collectives use, `FIRST-LAST`, when it pins them (jobs/flows.py).
COLLECTIVE_PORTS_ANNOTATION = "topoguard.io/collective-ports"
# Per-namespace enforcement of the policy-change webhook (warn | deny), and a policy's own break-glass
# annotation: admitted with its warnings even under deny (security must always be able to isolate).
POLICY_CHANGES_LABEL = "topoguard.io/policy-changes"
BREAK_GLASS_ANNOTATION = "topoguard.io/break-glass"

# What topoguard writes on the job.
ZONE_ANNOTATION = "topoguard.io/zone"
DECISION_ANNOTATION = "topoguard.io/decision"
GROUP_LABEL = "topoguard.io/group"
MANAGER_NAME = "topoguard.io/webhook"

# Kubernetes well-known keys.
DEFAULT_ZONE_LABEL = "topology.kubernetes.io/zone"
HOSTNAME_LABEL = "kubernetes.io/hostname"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"

# Cilium identity labels (research/cilium-semantics.md section 1.1).
CILIUM_NAMESPACE_LABEL = "io.kubernetes.pod.namespace"
CILIUM_SERVICE_ACCOUNT_LABEL = "io.cilium.k8s.policy.serviceaccount"
CILIUM_CLUSTER_LABEL = "io.cilium.k8s.policy.cluster"
CILIUM_NAMESPACE_LABELS_PREFIX = "io.cilium.k8s.namespace.labels."

# Kubeflow training-operator pod labels (research/kubeflow-formats.md section 2).
KF_OPERATOR_NAME = "training.kubeflow.org/operator-name"
KF_JOB_NAME = "training.kubeflow.org/job-name"
KF_REPLICA_TYPE = "training.kubeflow.org/replica-type"
KF_REPLICA_INDEX = "training.kubeflow.org/replica-index"
KF_JOB_ROLE = "training.kubeflow.org/job-role"

# Taint keys the node lifecycle controller owns: never tolerated on the user's behalf.
SYSTEM_TAINT_PREFIX = "node.kubernetes.io/"

# JobSet and batch/v1 Job pod labels (research/kubeflow-formats.md sections 3-4).
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_NAME_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
REPLICATED_JOB_REPLICAS_LABEL = "jobset.sigs.k8s.io/replicatedjob-replicas"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
GROUP_NAME_LABEL = "jobset.sigs.k8s.io/group-name"
COORDINATOR_LABEL = "jobset.sigs.k8s.io/coordinator"
BATCH_JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
LEGACY_JOB_NAME_LABEL = "job-name"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"

# Queue managers that create jobs suspended (DESIGN.md "Round 2": suspended jobs reserve nothing).
KUEUE_QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
