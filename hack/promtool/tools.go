//go:build tools

// Package tools pins the promtool binary make chart-lint runs, so that `go build` of the path below
// resolves against this module's go.mod. The build tag keeps it out of every normal build.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
