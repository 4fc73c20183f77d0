//go:build tools

// Package tools pins the two Cilium binaries the datapath suite runs (make e2e-datapath), so that
// `go build` of each path resolves against this module's go.mod and its replace line. It is never
// compiled itself: the build tag keeps it out of every normal build.
package tools

import (
	// The agent: compiles and loads the BPF datapath, allocates identities, enforces policy.
	_ "github.com/cilium/cilium/daemon"
	// The CNI plugin a container runtime calls (ADD/DEL) to wire a pod's netns to the agent.
	_ "github.com/cilium/cilium/plugins/cilium-cni"
)
