// Stands in for Grafana's github.com/grafana/grafana/apps/dashboard (see ../go.mod): the Go module proxy
// does not serve that module, and dashboard-linter imports it only for its adapter of v2 (Kubernetes-shaped)
// dashboards. This module declares just the types that adapter is compiled against, and refuses to decode a
// v2 spec, so a v2 dashboard fails loudly instead of being linted against guessed types. The chart's
// dashboard is classic JSON (schemaVersion 39), which the linter reads with its own types, never these.
module github.com/grafana/grafana/apps/dashboard

go 1.26.0
