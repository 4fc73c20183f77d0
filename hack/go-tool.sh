#!/usr/bin/env bash
# Build (once per machine) one of the Go tools make chart-lint runs, from the Go module pinned in
# hack/<tool>/go.mod, and print the path of the binary.
#
#   hack/go-tool.sh promtool          -> e.g. ~/.cache/topoguard-tools/promtool-v0.316.0_linux-amd64/promtool
#   hack/go-tool.sh dashboard-linter  -> e.g. ~/.cache/topoguard-tools/dashboard-linter-v0.2.0_linux-amd64/dashboard-linter
#
# Like hack/envtest/build.sh: the cache key is the pinned version plus GOOS/GOARCH, the pin lives in the
# tool's go.mod only, one build at a time per machine (flock), published atomically. Progress goes to
# stderr; stdout carries only the path. Env: GO, TOPOGUARD_TOOLS_CACHE (cache root).
set -euo pipefail

tool="${1:?usage: hack/go-tool.sh promtool|dashboard-linter}"
here="$(cd "$(dirname "$0")" && pwd)/$tool"
case "$tool" in
  # remove_all_sd: Prometheus's own build tag (plugins/*.go) leaving out the service-discovery plugins (cloud
  # SDKs) that rule checks and rule tests never use; most of a cold build otherwise.
  promtool) module=github.com/prometheus/prometheus; package=$module/cmd/promtool; check=(--version); tags=remove_all_sd ;;
  dashboard-linter) module=github.com/grafana/dashboard-linter; package=$module; check=(--help); tags= ;;
  *) echo "go-tool: unknown tool '$tool'" >&2; exit 2 ;;
esac
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
if ! "$GO" version >/dev/null 2>&1; then
  echo "go-tool: no Go toolchain (tried '$GO'); install Go >= 1.26 or set GO=/path/to/go" >&2
  exit 2
fi
version="$(awk -v m="$module" '($1 == m || ($1 == "require" && $2 == m)) { print $NF; exit }' "$here/go.mod")"
if [[ -z "$version" ]]; then
  echo "go-tool: cannot read the $module pin from $here/go.mod" >&2
  exit 2
fi
cache_root="${TOPOGUARD_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/topoguard-tools}"
dest="$cache_root/$tool-${version}_$("$GO" env GOOS)-$("$GO" env GOARCH)"

usable() { [[ -x "$dest/$tool" ]] && "$dest/$tool" "${check[@]}" >/dev/null 2>&1; }

if usable; then
  echo "$dest/$tool"
  exit 0
fi
mkdir -p "$cache_root"
exec 9>"$cache_root/.build-$tool.lock"
flock 9
if usable; then
  echo "$dest/$tool"
  exit 0
fi
work="$(mktemp -d "$cache_root/.build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
start=$SECONDS
echo "go-tool: building $tool from $module $version with $("$GO" version) (cold build; cached afterwards)" >&2
# -mod=readonly: go.sum is committed, so a fresh machine builds exactly the modules CI tested.
(cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=readonly "$GO" build -trimpath -tags "$tags" -ldflags "-s -w" -o "$work/$tool" "$package" 9>&-)
echo "go-tool: $tool built after $((SECONDS - start))s" >&2
chmod 755 "$work"
rm -rf "$dest"
mv "$work" "$dest"
trap - EXIT
echo "$dest/$tool"
