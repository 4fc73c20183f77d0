"""A stored job's `JobShape`: the replica types and required flows of its `JobGroup`, for the audit.

The audit (app/engine/audit.py) checks the flows admission derives from a job (`parse_job`), between
the job's actual pods. The snapshot keeps this shape with each stored job instead of the job itself:
a few strings and flows, not pod templates.

A pod is matched to its replica type by the operator labels that name the type
(research/kubeflow-formats.md sections 2-4): `training.kubeflow.org/replica-type` (kubeflow.org/v1
kinds), `training.kubeflow.org/job-role` (mpi-operator v2beta1 has no replica-type label: launcher
and worker), `jobset.sigs.k8s.io/replicatedjob-name` (JobSet, Trainer v2). Labels only the leader
pod carries (v1's `job-role=master` on the coordinator's pod 0) never tell types apart.
"""

from __future__ import annotations

from app.models.job import JobGroup, JobShape, RoleShape
from app.models.labels import KF_JOB_ROLE, KF_REPLICA_TYPE, REPLICATED_JOB_NAME_LABEL

ROLE_LABELS = (KF_REPLICA_TYPE, KF_JOB_ROLE, REPLICATED_JOB_NAME_LABEL)


def shape_of(group: JobGroup) -> JobShape:
    """The group's replica types (with the labels that select each one's pods) and its flows."""
    roles = []
    for replica in group.replicas:
        selector = tuple(
            (k, replica.pod_labels[k])
            for k in ROLE_LABELS
            if k in replica.pod_labels and k not in replica.leader_labels
        )
        roles.append(RoleShape(replica.key, replica.role, selector, replica.count, replica.is_coordinator))
    return JobShape(tuple(roles), group.flows)
