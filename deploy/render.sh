#!/usr/bin/env bash
# Render deploy/topoguard.yaml (plain manifests for people without Helm) from the chart.
#
#   deploy/render.sh          rewrite deploy/topoguard.yaml
#   deploy/render.sh --check  exit 1 if deploy/topoguard.yaml is not what the chart renders now
#
# Default values, except the certificate: `helm template` would generate a new CA and key on every
# run, and a private key committed to git is shared by everyone who applies the file. The plain
# manifests therefore use tls.mode=secret; deploy/install.sh creates the Secret with openssl and
# substitutes the CA for the ${TOPOGUARD_CA_BUNDLE} placeholder (the apiserver rejects the file
# if it is applied without that step, instead of installing a webhook nobody can call).
set -euo pipefail
cd "$(dirname "$0")/.."

NAMESPACE=topoguard-system
HELM="$(hack/helm.sh)"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT

{
  cat <<HEADER
# topoguard — plain manifests rendered from charts/topoguard by deploy/render.sh.
# DO NOT EDIT: change the chart and run deploy/render.sh.
# Install with deploy/install.sh (creates the serving certificate, then applies this file).
---
apiVersion: v1
kind: Namespace
metadata:
  name: ${NAMESPACE}
  labels:
    # The webhook pods meet the "restricted" Pod Security Standard.
    pod-security.kubernetes.io/enforce: restricted
    pod-security.kubernetes.io/enforce-version: latest
HEADER
  # shellcheck disable=SC2016  # the ${...} is a literal placeholder that install.sh substitutes
  "$HELM" template topoguard charts/topoguard --namespace "$NAMESPACE" \
    --set tls.mode=secret \
    --set tls.secret.name=topoguard-tls \
    --set tls.secret.caBundle=TOPOGUARDCABUNDLE \
    | sed 's/caBundle: TOPOGUARDCABUNDLE$/caBundle: ${TOPOGUARD_CA_BUNDLE}/'
} > "$out"

if [[ "${1:-}" == "--check" ]]; then
  if ! diff -u deploy/topoguard.yaml "$out"; then
    echo "deploy/topoguard.yaml is stale: run deploy/render.sh" >&2
    exit 1
  fi
  echo "deploy/topoguard.yaml is up to date"
else
  cp "$out" deploy/topoguard.yaml
  echo "wrote deploy/topoguard.yaml"
fi
