"""The only package that talks to the Kubernetes API (and reads snapshot files): projections,
file snapshots, list+watch, and the immutable snapshot store."""
