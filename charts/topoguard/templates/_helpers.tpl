{{/*
Names, labels and the serving-certificate material shared by every template.
*/}}

{{/* The chart name, overridable. */}}
{{- define "topoguard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The full name used for every object. Truncated to 63 characters because some Kubernetes name
fields are limited to that (DNS-1123 label: Service names, label values), and suffixes such as
"-tls" are kept short enough that the longest object name stays valid.
*/}}
{{- define "topoguard.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "topoguard.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that never change for the life of a release: the Deployment selector. */}}
{{- define "topoguard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "topoguard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end -}}

{{- define "topoguard.labels" -}}
helm.sh/chart: {{ include "topoguard.chart" . }}
{{ include "topoguard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: topoguard
{{- end -}}

{{- define "topoguard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "topoguard.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "topoguard.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the serving certificate (every TLS mode mounts this name). */}}
{{- define "topoguard.tlsSecretName" -}}
{{- if eq .Values.tls.mode "secret" -}}
{{- .Values.tls.secret.name -}}
{{- else -}}
{{- printf "%s-tls" (include "topoguard.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "topoguard.serviceName" -}}
{{- include "topoguard.fullname" . -}}
{{- end -}}

{{/* DNS names the apiserver may use for the Service: the certificate's SANs. */}}
{{- define "topoguard.serviceDNSNames" -}}
{{- $svc := include "topoguard.serviceName" . -}}
{{- $ns := .Release.Namespace -}}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.%s" $svc $ns .Values.clusterDomain) | toJson -}}
{{- end -}}

{{/*
Namespaces the webhooks must never see: kube-system and the release's own namespace always (a
webhook that gates the namespace it runs in can deadlock its own recovery), plus any the user lists.
Selected by kubernetes.io/metadata.name, which the apiserver sets and users cannot change
(KEP-2161), unlike the opt-in label.
*/}}
{{- define "topoguard.excludedNamespaces" -}}
{{- concat (list "kube-system" .Release.Namespace) .Values.webhook.excludeNamespaces | uniq | toJson -}}
{{- end -}}

{{/* The webhook rules: one per API group, listing only the training-job kinds turned on. */}}
{{- define "topoguard.webhookRules" -}}
{{- $ops := .operations -}}
{{- $kinds := .root.Values.webhook.jobKinds -}}
{{- $groups := dict
      "kubeflow.org" (list "pytorchjobs" "tfjobs" "mpijobs" "xgboostjobs" "paddlejobs" "jaxjobs")
      "jobset.x-k8s.io" (list "jobsets")
      "trainer.kubeflow.org" (list "trainjobs") -}}
{{- range $group := list "kubeflow.org" "jobset.x-k8s.io" "trainer.kubeflow.org" }}
{{- $resources := list }}
{{- range $r := get $groups $group }}
{{- if get $kinds $r }}{{ $resources = append $resources $r }}{{ end }}
{{- end }}
{{- if $resources }}
- apiGroups: [{{ $group | quote }}]
  apiVersions: ["*"]
  operations: {{ toJson $ops }}
  resources: {{ toJson $resources }}
  scope: Namespaced
{{- end }}
{{- end }}
{{- end -}}

{{/* The namespaceSelector shared by both webhooks. */}}
{{- define "topoguard.namespaceSelector" -}}
matchExpressions:
  - key: topoguard.io/enabled
    operator: In
    values: ["true"]
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values: {{ include "topoguard.excludedNamespaces" . }}
{{- end -}}

{{/*
Serving-certificate material for tls.mode=helm, computed once per render and memoised on the root
context so the Secret and both webhook configurations see the same bytes.

- First install (or `helm template`): a new ECDSA P-256 CA and a leaf signed by it.
- Upgrade: `lookup` finds the Secret and keeps it. The leaf is re-signed by the SAME CA when it is
  within tls.helm.renewBeforeDays of expiry, so the caBundle does not change. When the CA itself is
  near expiry a new CA is made and the bundle carries the new AND the previous CA, so whichever
  leaf the pods serve during the kubelet's Secret-refresh delay (about a minute) is trusted.
Returns YAML: caBundle, caCert, caKey, cert, key, caNotAfter, certNotAfter (Unix seconds).
*/}}
{{- define "topoguard.helmTLS" -}}
{{- if not (hasKey $ "topoguardTLS") -}}
{{- $cfg := .Values.tls.helm -}}
{{- $now := now | unixEpoch | atoi -}}
{{- $renewAt := add $now (mul $cfg.renewBeforeDays 86400) -}}
{{- $secret := lookup "v1" "Secret" .Release.Namespace (include "topoguard.tlsSecretName" .) -}}
{{- $data := dict -}}
{{- $ann := dict -}}
{{- if $secret -}}
{{- $data = default (dict) $secret.data -}}
{{- $ann = default (dict) $secret.metadata.annotations -}}
{{- end -}}
{{- $have := and (hasKey $data "ca.crt") (hasKey $data "ca.key") (hasKey $data "tls.crt") (hasKey $data "tls.key") (hasKey $ann "topoguard.io/ca-not-after") (hasKey $ann "topoguard.io/cert-not-after") -}}
{{- $out := dict -}}
{{- $caFresh := false -}}
{{- if and $have (gt (get $ann "topoguard.io/ca-not-after" | atoi) $renewAt) -}}
{{- $_ := set $out "caCert" (get $data "ca.crt" | b64dec) -}}
{{- $_ := set $out "caKey" (get $data "ca.key" | b64dec) -}}
{{- $_ := set $out "caNotAfter" (get $ann "topoguard.io/ca-not-after" | atoi) -}}
{{- $_ := set $out "caBundle" (get $data "ca-bundle.crt" | default (get $data "ca.crt") | b64dec) -}}
{{- else -}}
{{- $ca := genCAWithKey (printf "%s-ca" (include "topoguard.fullname" .)) (int $cfg.caValidityDays) (genPrivateKey "ecdsa") -}}
{{- $caFresh = true -}}
{{- $_ := set $out "caCert" $ca.Cert -}}
{{- $_ := set $out "caKey" $ca.Key -}}
{{- $_ := set $out "caNotAfter" (add $now (mul $cfg.caValidityDays 86400)) -}}
{{- $bundle := $ca.Cert -}}
{{- if $have -}}
{{/* Keep the outgoing CA trusted until the pods have picked up the new leaf. */}}
{{- $bundle = printf "%s%s" $ca.Cert (get $data "ca.crt" | b64dec) -}}
{{- end -}}
{{- $_ := set $out "caBundle" $bundle -}}
{{- end -}}
{{- if and $have (not $caFresh) (gt (get $ann "topoguard.io/cert-not-after" | atoi) $renewAt) -}}
{{- $_ := set $out "cert" (get $data "tls.crt" | b64dec) -}}
{{- $_ := set $out "key" (get $data "tls.key" | b64dec) -}}
{{- $_ := set $out "certNotAfter" (get $ann "topoguard.io/cert-not-after" | atoi) -}}
{{- else -}}
{{- $signer := buildCustomCert ($out.caCert | b64enc) ($out.caKey | b64enc) -}}
{{- $names := include "topoguard.serviceDNSNames" . | fromJsonArray -}}
{{- $leaf := genSignedCertWithKey (index $names 2) nil $names (int $cfg.certValidityDays) $signer (genPrivateKey "ecdsa") -}}
{{- $_ := set $out "cert" $leaf.Cert -}}
{{- $_ := set $out "key" $leaf.Key -}}
{{- $_ := set $out "certNotAfter" (add $now (mul $cfg.certValidityDays 86400)) -}}
{{- end -}}
{{- $_ := set $ "topoguardTLS" $out -}}
{{- end -}}
{{- toYaml (get $ "topoguardTLS") -}}
{{- end -}}

{{/* The caBundle (base64) for the webhook configurations, per TLS mode; empty for cert-manager. */}}
{{- define "topoguard.caBundle" -}}
{{- if eq .Values.tls.mode "helm" -}}
{{- (include "topoguard.helmTLS" . | fromYaml).caBundle | b64enc -}}
{{- else if eq .Values.tls.mode "secret" -}}
{{- .Values.tls.secret.caBundle -}}
{{- end -}}
{{- end -}}

{{/* Annotations for the webhook configurations (cert-manager's CA injector). */}}
{{- define "topoguard.webhookAnnotations" -}}
{{- if eq .Values.tls.mode "cert-manager" }}
cert-manager.io/inject-ca-from: {{ printf "%s/%s" .Release.Namespace (include "topoguard.fullname" .) }}
{{- end }}
{{- end -}}

{{/* The server's request deadline: one second under the shorter webhook timeout (R8). */}}
{{- define "topoguard.requestDeadlineSeconds" -}}
{{- $t := min .Values.webhook.mutating.timeoutSeconds .Values.webhook.validating.timeoutSeconds -}}
{{- if gt (int $t) 1 -}}{{ sub $t 1 }}{{- else -}}0.5{{- end -}}
{{- end -}}
