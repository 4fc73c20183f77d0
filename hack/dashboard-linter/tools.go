//go:build tools

// Package tools pins the dashboard-linter binary make chart-lint runs (see go.mod).
package tools

import (
	_ "github.com/grafana/dashboard-linter"
)
