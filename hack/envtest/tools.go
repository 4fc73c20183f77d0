//go:build tools

// Package tools pins the binaries the end-to-end suite needs, so that `go build` of each path
// below resolves against this module's go.mod (and its replace lines). It is never compiled
// itself: the build tag keeps it out of every normal build.
package tools

import (
	// etcd's server binary, at the version kube-apiserver v1.36.3's go.mod requires.
	_ "go.etcd.io/etcd/server/v3"
	// The API server itself (no kubelet: envtest's set-up).
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	// make e2e-full (build-components.sh): the scheduler that binds pods to the suite's Nodes, and
	// the controller-manager for its job controller (JobSet's Jobs -> Pods) and the namespaces'
	// default ServiceAccounts. Same module, so always the apiserver's version.
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
