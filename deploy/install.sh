#!/usr/bin/env bash
# Install topoguard from the plain manifests (no Helm): create the serving certificate, then apply
# deploy/topoguard.yaml with its CA filled in.
#
#   deploy/install.sh              install into the current kubectl context
#   deploy/install.sh --dry-run    write the certificate to a temp dir and print the manifests
#                                  (the Secret included) instead of applying anything
#
# Needs kubectl and openssl. The certificate is an ECDSA P-256 leaf for
# topoguard.topoguard-system.svc signed by a throw-away CA whose key is deleted afterwards; an
# existing Secret is kept, so re-running upgrades the manifests without changing the certificate.
# To rotate: delete the Secret topoguard-tls and run this again (or switch to the Helm chart, which
# renews on upgrade, or to cert-manager).
set -euo pipefail
cd "$(dirname "$0")/.."

NAMESPACE=topoguard-system
SERVICE=topoguard
SECRET=topoguard-tls
CERT_DAYS="${CERT_DAYS:-365}"
DRY_RUN=false
[[ "${1:-}" == "--dry-run" ]] && DRY_RUN=true

for tool in openssl $($DRY_RUN || echo kubectl); do
  command -v "$tool" >/dev/null || { echo "deploy/install.sh: $tool not found" >&2; exit 1; }
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

make_certificate() {
  local dns="DNS:${SERVICE},DNS:${SERVICE}.${NAMESPACE},DNS:${SERVICE}.${NAMESPACE}.svc,DNS:${SERVICE}.${NAMESPACE}.svc.cluster.local"
  openssl ecparam -name prime256v1 -genkey -noout -out "$work/ca.key" 2>/dev/null
  openssl req -x509 -new -key "$work/ca.key" -subj "/CN=topoguard-ca" -days 3650 -out "$work/ca.crt" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
  openssl ecparam -name prime256v1 -genkey -noout -out "$work/tls.key" 2>/dev/null
  openssl req -new -key "$work/tls.key" -subj "/CN=${SERVICE}.${NAMESPACE}.svc" -out "$work/tls.csr"
  printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=%s\n' \
    "$dns" > "$work/ext.cnf"
  openssl x509 -req -in "$work/tls.csr" -CA "$work/ca.crt" -CAkey "$work/ca.key" -CAcreateserial \
    -days "$CERT_DAYS" -sha256 -extfile "$work/ext.cnf" -out "$work/tls.crt" 2>/dev/null
  rm -f "$work/ca.key" "$work/tls.csr" "$work/ca.srl"
}

secret_manifest() {
  cat <<YAML
apiVersion: v1
kind: Secret
type: kubernetes.io/tls
metadata:
  name: ${SECRET}
  namespace: ${NAMESPACE}
  labels: {app.kubernetes.io/name: topoguard, app.kubernetes.io/part-of: topoguard}
data:
  tls.crt: $(base64 -w0 < "$work/tls.crt")
  tls.key: $(base64 -w0 < "$work/tls.key")
  ca.crt: $(base64 -w0 < "$work/ca.crt")
YAML
}

if $DRY_RUN; then
  make_certificate
  secret_manifest
  echo "---"
  sed "s|\${TOPOGUARD_CA_BUNDLE}|$(base64 -w0 < "$work/ca.crt")|" deploy/topoguard.yaml
  exit 0
fi

kubectl apply -f - <<YAML
apiVersion: v1
kind: Namespace
metadata:
  name: ${NAMESPACE}
  labels: {pod-security.kubernetes.io/enforce: restricted}
YAML
if ! kubectl -n "$NAMESPACE" get secret "$SECRET" >/dev/null 2>&1; then
  make_certificate
  secret_manifest | kubectl apply -f -
fi
ca_bundle="$(kubectl -n "$NAMESPACE" get secret "$SECRET" -o jsonpath='{.data.ca\.crt}')"
[[ -n "$ca_bundle" ]] || { echo "deploy/install.sh: Secret $SECRET has no ca.crt" >&2; exit 1; }
sed "s|\${TOPOGUARD_CA_BUNDLE}|${ca_bundle}|" deploy/topoguard.yaml | kubectl apply -f -
kubectl -n "$NAMESPACE" rollout status deployment/topoguard --timeout=180s
echo "topoguard is running. Opt a namespace in: kubectl label namespace <ns> topoguard.io/enabled=true"
