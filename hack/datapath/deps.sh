#!/usr/bin/env bash
# Install (as root, from Debian) what the datapath suite needs and is not on a fresh CI machine:
#   clang-19   Cilium compiles its BPF datapath at run time and needs LLVM >= 18.1 (Debian 12: 19.1.7);
#              the agent calls `clang`, so the harness puts a clang -> clang-19 link first on its PATH.
#   iproute2   ip (links, addresses, routes inside the suite's network namespaces).
#   iptables   iptables-save: the suite asserts the host's rules are unchanged (the agent runs with
#              --install-iptables-rules=false). ipset: the agent probes it even so.
#   util-linux nsenter / unshare (on every Debian, listed for completeness).
# A no-op when everything is there already, so `make e2e-datapath` calls it every time.
set -euo pipefail
packages=(clang-19 llvm-19 iproute2 iptables ipset util-linux)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
    exit 0
fi
if [[ $EUID -ne 0 ]]; then
    echo "datapath: missing Debian packages ${missing[*]}; run as root (apt-get install ${missing[*]})" >&2
    exit 2
fi
echo "datapath: apt-get install ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
