"""The admission pipeline: a review in, an outcome out. No HTTP, no Kubernetes API, no metrics.

- `pipeline`: an AdmissionReview of a training job → the response AdmissionReview (mutate/validate).
- `policy_changes`: an AdmissionReview of a policy object → the what-if verdict (POST /validate-policy).
- `responses`: the response AdmissionReviews themselves (uid, base64 patch, bounded warnings, status).
- `inflight`: this replica's in-flight reservations (admitted jobs its watch does not show yet).

Three callers, one answer per review: the server (`app.http`: bytes ↔ reviews, workers, connections),
`topoguard review` (`app.commands.review`) and the policy events of the audit controller.
"""
