{{/* Object names: the release name if it contains "tender", else <release>-tender. */}}
{{- define "tender.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains "tender" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-tender" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The labels of deploy/base, and the instance label when asked for. */}}
{{- define "tender.selectorLabels" -}}
app.kubernetes.io/name: tender
app.kubernetes.io/component: registry-mirror
{{- if .Values.instanceLabel }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
{{- end -}}

{{- define "tender.labels" -}}
{{ include "tender.selectorLabels" . }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The image reference: repository:tag, or repository:tag@digest. */}}
{{- define "tender.image" -}}
{{- $ref := printf "%s:%s" .Values.image.repository (toString .Values.image.tag) -}}
{{- with .Values.image.digest -}}{{- $ref = printf "%s@%s" $ref . -}}{{- end -}}
{{- $ref -}}
{{- end -}}

{{/* Checks that tender (or the cluster) would refuse later, refused at render. */}}
{{- define "tender.validate" -}}
{{- $v := .Values -}}
{{- if and (gt (int $v.replicas) 1) (ne $v.storage.type "s3") -}}
{{- fail (printf "replicas: %d replicas need storage.type s3 (with %s each pod is a separate cache, and a claim cannot be shared: tender locks its data directory)" (int $v.replicas) $v.storage.type) -}}
{{- end -}}
{{- if and $v.tls.certManager.enabled (not $v.tls.enabled) -}}
{{- fail "tls.certManager.enabled needs tls.enabled: true (the Certificate writes the Secret tender reads)" -}}
{{- end -}}
{{- if and $v.tls.certManager.enabled (not $v.tls.certManager.issuerRef.name) -}}
{{- fail "tls.certManager.issuerRef.name is required with tls.certManager.enabled" -}}
{{- end -}}
{{- $auth := or $v.auth.htpasswd.secretName $v.auth.tokens.secretName $v.tls.clientCA -}}
{{- range $i, $u := $v.upstreams -}}
{{- if and $u.credentials (not $u.public) (not $auth) -}}
{{- fail (printf "upstreams[%d] (%s): an upstream with credentials is served only to authenticated clients: set auth (htpasswd or tokens), or public: true on the upstream (README, \"Credentials and public\")" $i $u.name) -}}
{{- end -}}
{{- end -}}
{{- if and $v.networkPolicy.enabled (not $v.networkPolicy.clientNamespaceLabels) (not $v.networkPolicy.clientPodLabels) -}}
{{- fail "networkPolicy: clientNamespaceLabels and clientPodLabels are both empty, which would admit nobody by label; set one, or networkPolicy.enabled: false" -}}
{{- end -}}
{{- range $k := list "listen" "data" -}}
{{- if not (hasKey $v.config $k) -}}
{{- fail (printf "config.%s is required (listen 0.0.0.0:5000 and data below /var/lib/tender: the port and volume the pod is built around)" $k) -}}
{{- end -}}
{{- end -}}
{{- if not (hasSuffix ":5000" (toString $v.config.listen)) -}}
{{- fail (printf "config.listen %q: the container port, probes, Service and NetworkPolicy use port 5000" $v.config.listen) -}}
{{- end -}}
{{- if not (hasPrefix "/var/lib/tender/" (toString $v.config.data)) -}}
{{- fail (printf "config.data %q must be below /var/lib/tender/ (the data volume's mount point)" $v.config.data) -}}
{{- end -}}
{{- end -}}

{{/* tender.yaml: .Values.config plus the sections the chart writes from its values. */}}
{{- define "tender.config" -}}
{{- $v := .Values -}}
{{- $cfg := deepCopy $v.config -}}
{{- $ups := list -}}
{{- range $i, $u := $v.upstreams -}}
{{-   $e := omit $u "credentials" -}}
{{-   with $u.credentials -}}
{{-     if .username }}{{ $_ := set $e "username" .username }}{{ end -}}
{{-     $_ := set $e "passwordFile" (printf "/etc/tender-upstreams/%d/%s" $i (.passwordKey | default "password")) -}}
{{-   end -}}
{{-   $ups = append $ups $e -}}
{{- end -}}
{{- $_ := set $cfg "upstreams" $ups -}}
{{- if $v.tls.enabled -}}
{{-   $tls := dict "cert" "/etc/tender-tls/tls.crt" "key" "/etc/tender-tls/tls.key" "reloadInterval" $v.tls.reloadInterval -}}
{{-   if $v.tls.clientCA }}{{ $_ := set $tls "clientCa" "/etc/tender-tls/ca.crt" }}{{ end -}}
{{-   $_ := set $cfg "tls" $tls -}}
{{- end -}}
{{- $auth := dict -}}
{{- with $v.auth.htpasswd.secretName }}{{ $_ := set $auth "htpasswd" (printf "/etc/tender-auth/htpasswd/%s" $v.auth.htpasswd.key) }}{{ end -}}
{{- with $v.auth.tokens.secretName }}{{ $_ := set $auth "tokenFile" (printf "/etc/tender-auth/tokens/%s" $v.auth.tokens.key) }}{{ end -}}
{{- if $auth -}}
{{-   if $v.auth.anonymousPull }}{{ $_ := set $auth "anonymousPull" true }}{{ end -}}
{{-   $_ := set $cfg "auth" $auth -}}
{{- end -}}
{{- $admin := dict -}}
{{- with $v.admin.tokenSecret.name }}{{ $_ := set $admin "tokenFile" (printf "/etc/tender-admin/%s" $v.admin.tokenSecret.key) }}{{ end -}}
{{- with $v.admin.listen }}{{ $_ := set $admin "listen" . }}{{ end -}}
{{- if $admin }}{{ $_ := set $cfg "admin" $admin }}{{ end -}}
{{- if eq $v.storage.type "s3" -}}
{{-   $s3 := deepCopy $v.storage.s3.extra -}}
{{-   range $k := list "endpoint" "bucket" "region" "prefix" -}}
{{-     with index $v.storage.s3 $k }}{{ $_ := set $s3 $k . }}{{ end -}}
{{-   end -}}
{{-   if $v.storage.s3.credentialsSecret -}}
{{-     $_ := set $s3 "accessKeyIdFile" "/etc/tender-s3/access-key-id" -}}
{{-     $_ := set $s3 "secretAccessKeyFile" "/etc/tender-s3/secret-access-key" -}}
{{-   end -}}
{{-   if $v.storage.s3.indexKeySecret -}}
{{-     $_ := set $s3 "indexKeyFile" "/etc/tender-s3-index/index-key" -}}
{{-   end -}}
{{-   $_ := set $cfg "storage" (dict "s3" $s3) -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* The ConfigMap's name: <fullname>-config-<content hash>, like kustomize's configMapGenerator
     (10 characters of the sha256, kustomize's alphabet), so a changed config rolls the pod. */}}
{{- define "tender.configMapName" -}}
{{- $h := include "tender.config" . | sha256sum | trunc 10 -}}
{{- $h = $h | replace "0" "g" | replace "1" "h" | replace "3" "k" | replace "a" "m" | replace "e" "t" -}}
{{- printf "%s-config-%s" (include "tender.fullname" .) $h -}}
{{- end -}}

{{/* The TCP port of the storage.s3 endpoint (443 without one: AWS). */}}
{{- define "tender.s3Port" -}}
{{- $ep := .Values.storage.s3.endpoint -}}
{{- if not $ep -}}443{{- else -}}
{{- $u := urlParse $ep -}}
{{- $hp := splitList ":" $u.host -}}
{{- if gt (len $hp) 1 -}}{{ last $hp }}{{- else if eq $u.scheme "http" -}}80{{- else -}}443{{- end -}}
{{- end -}}
{{- end -}}
