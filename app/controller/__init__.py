"""The audit controller: leader election, the audit loop and everything topoguard WRITES to the API.

Sits above app.cache (whose snapshots it reads) beside app.http; with app.cache the only package that
imports `kubernetes`, and the only one that writes (Leases, Events, PolicyReports). See
docs/architecture.md "The audit controller".
"""
