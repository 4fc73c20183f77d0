module github.com/topoguard/topoguard/hack/datapath

go 1.26.0

require github.com/cilium/cilium v1.20.2

// Cilium v1.20.2 pins gobgp/v4 at a pseudo-version (v4.6.1-0.20260630022313-d6dee8360046) that the Go
// module proxy answers with 403; the tagged v4.7.0 builds unchanged (BGP stays off in the harness).
replace github.com/osrg/gobgp/v4 => github.com/osrg/gobgp/v4 v4.7.0
