{{/*
Names, labels and the pieces the gateway and the endpoint picker share.
*/}}

{{/* The chart's name, at most 63 characters. */}}
{{- define "inferrail.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: objects are named after it. */}}
{{- define "inferrail.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The endpoint picker's objects: FULLNAME-epp. */}}
{{- define "inferrail.epp.fullname" -}}
{{- printf "%s-epp" (include "inferrail.fullname" . | trunc 59 | trimSuffix "-") }}
{{- end }}

{{/* helm.sh/chart: NAME-VERSION. */}}
{{- define "inferrail.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The labels every object carries. */}}
{{- define "inferrail.labels" -}}
helm.sh/chart: {{ include "inferrail.chart" . }}
{{ include "inferrail.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: inferrail
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The labels that select the release's pods. */}}
{{- define "inferrail.selectorLabels" -}}
app.kubernetes.io/name: {{ include "inferrail.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "inferrail.gateway.selectorLabels" -}}
{{ include "inferrail.selectorLabels" . }}
app.kubernetes.io/component: gateway
{{- end }}

{{- define "inferrail.epp.selectorLabels" -}}
{{ include "inferrail.selectorLabels" . }}
app.kubernetes.io/component: endpoint-picker
{{- end }}

{{/* The image: REPOSITORY@DIGEST, else REPOSITORY:TAG (default appVersion). */}}
{{- define "inferrail.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion | toString -}}
{{- if eq $tag "latest" -}}
{{- fail "image.tag: \"latest\" is not allowed: pin a version (the default is the chart's appVersion)" -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end }}

{{/*
The port of a listen address of the config, checked: in a pod it must bind
the pod's address, not loopback. Takes (dict "what" KEY "addr" ADDRESS).
*/}}
{{- define "inferrail.portOf" -}}
{{- $addr := toString .addr -}}
{{- $parts := splitList ":" $addr -}}
{{- $port := last $parts -}}
{{- $host := join ":" (initial $parts) | trimPrefix "[" | trimSuffix "]" -}}
{{- if or (lt (len $parts) 2) (not (regexMatch "^[0-9]+$" $port)) (eq $port "0") -}}
{{- fail (printf "config.%s: want host:port with a fixed port, such as \":8080\", got %q" .what $addr) -}}
{{- end -}}
{{- if or (eq $host "localhost") (hasPrefix "127." $host) (eq $host "::1") -}}
{{- fail (printf "config.%s (%s) binds a loopback address: in a pod it must bind the pod's address, such as \":%s\", so Services and probes reach it" .what $addr $port) -}}
{{- end -}}
{{- $port -}}
{{- end }}

{{- define "inferrail.clientPort" -}}
{{- include "inferrail.portOf" (dict "what" "listen" "addr" (required "config.listen is required: the client address, such as \":8080\"" .Values.config.listen)) -}}
{{- end }}

{{- define "inferrail.adminPort" -}}
{{- include "inferrail.portOf" (dict "what" "admin_listen" "addr" (required "config.admin_listen is required: the chart probes /livez and /readyz and scrapes /metrics there, such as \":9090\"" .Values.config.admin_listen)) -}}
{{- end }}

{{/* Where the admin token is mounted; the config's admin_token_file. */}}
{{- define "inferrail.adminTokenFile" -}}
/etc/inferrail/admin-token
{{- end }}

{{/* The Secret holding the admin token, "" when the chart mounts none. */}}
{{- define "inferrail.adminToken.secretName" -}}
{{- if .Values.adminToken.existingSecret -}}
{{- .Values.adminToken.existingSecret -}}
{{- else if .Values.adminToken.create -}}
{{- printf "%s-admin-token" (include "inferrail.fullname" . | trunc 51 | trimSuffix "-") -}}
{{- end -}}
{{- end }}

{{/*
The live configuration: .Values.config with admin_token_file pointing at
the mounted token.
*/}}
{{- define "inferrail.liveConfig" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $file := include "inferrail.adminTokenFile" . -}}
{{- if include "inferrail.adminToken.secretName" . -}}
{{- if and $cfg.admin_token_file (ne (toString $cfg.admin_token_file) $file) -}}
{{- fail (printf "config.admin_token_file: leave it out: the chart sets it to the adminToken Secret it mounts (%s)" $file) -}}
{{- end -}}
{{- $_ := set $cfg "admin_token_file" $file -}}
{{- else if not $cfg.admin_token_file -}}
{{- fail "adminToken: set adminToken.existingSecret or adminToken.create: true (or mount a token yourself and set config.admin_token_file): the admin listener binds the pod's address, and live then requires admin_token_file" -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end }}

{{/* The InferencePool the chart creates. */}}
{{- define "inferrail.inferencePool.name" -}}
{{- .Values.epp.inferencePool.name | default (include "inferrail.fullname" .) -}}
{{- end }}

{{/* The InferencePool the picker watches, "" for none. */}}
{{- define "inferrail.epp.poolName" -}}
{{- $created := "" -}}
{{- if .Values.epp.inferencePool.create -}}
{{- $created = include "inferrail.inferencePool.name" . -}}
{{- end -}}
{{- if and .Values.epp.pool.name $created (ne .Values.epp.pool.name $created) -}}
{{- fail (printf "epp.pool.name (%s) is not the InferencePool the chart creates (%s): leave epp.pool.name empty, or set epp.inferencePool.name to it" .Values.epp.pool.name $created) -}}
{{- end -}}
{{- .Values.epp.pool.name | default $created -}}
{{- end }}

{{- define "inferrail.epp.poolNamespace" -}}
{{- .Values.epp.pool.namespace | default .Release.Namespace -}}
{{- end }}

{{/*
The picker's configuration: the live configuration with its epp section:
epp.listen on epp.port (all addresses: Envoy dials the pod), and epp.pool
the InferencePool it watches.
*/}}
{{- define "inferrail.eppConfig" -}}
{{- $cfg := fromYaml (include "inferrail.liveConfig" .) -}}
{{- $epp := deepCopy (default (dict) (get $cfg "epp")) -}}
{{- $listen := printf ":%v" .Values.epp.port -}}
{{- if and (hasKey $epp "listen") (ne (toString $epp.listen) $listen) -}}
{{- fail (printf "config.epp.listen (%v): leave it out: the chart sets it to %q from epp.port" $epp.listen $listen) -}}
{{- end -}}
{{- $_ := set $epp "listen" $listen -}}
{{- if and (hasKey $epp "secure_serving") (ne $epp.secure_serving .Values.epp.secureServing) -}}
{{- fail (printf "config.epp.secure_serving (%v): leave it out: the chart sets it from epp.secureServing (%v)" $epp.secure_serving .Values.epp.secureServing) -}}
{{- end -}}
{{- $_ := set $epp "secure_serving" .Values.epp.secureServing -}}
{{- $le := deepCopy (default (dict) (get $epp "leader_election")) -}}
{{- if and (hasKey $le "enabled") (ne $le.enabled .Values.epp.leaderElection.enabled) -}}
{{- fail (printf "config.epp.leader_election.enabled (%v): leave it out: the chart sets it from epp.leaderElection.enabled (%v)" $le.enabled .Values.epp.leaderElection.enabled) -}}
{{- end -}}
{{- if and (gt (int .Values.epp.replicaCount) 1) (not .Values.epp.leaderElection.enabled) -}}
{{- fail (printf "epp.replicaCount %v: several pickers need epp.leaderElection.enabled (else each would be ready and route with its own view of the load)" .Values.epp.replicaCount) -}}
{{- end -}}
{{- $_ := set $le "enabled" .Values.epp.leaderElection.enabled -}}
{{- $_ := set $epp "leader_election" $le -}}
{{- $pool := include "inferrail.epp.poolName" . -}}
{{- $kv := int .Values.epp.kvEventsPort -}}
{{- if and $kv (not $pool) -}}
{{- fail "epp.kvEventsPort: the engine pods publish to the picker's Service: set epp.pool.name or epp.inferencePool.create" -}}
{{- end -}}
{{- if and $kv (gt (int .Values.epp.replicaCount) 1) -}}
{{- fail (printf "epp.kvEventsPort with epp.replicaCount %v: each pod's KV events would reach one picker only; with several pickers let each connect to every pod (config.epp.pool.kv_events_port) and set epp.kvEventsPort to 0" .Values.epp.replicaCount) -}}
{{- end -}}
{{- if $pool -}}
{{- $p := deepCopy (default (dict) (get $epp "pool")) -}}
{{- $_ := set $p "name" $pool -}}
{{- $_ := set $p "namespace" (include "inferrail.epp.poolNamespace" .) -}}
{{- if $kv -}}
{{- $listen := printf "tcp://*:%d" $kv -}}
{{- if and (hasKey $p "kv_events_listen") (ne (toString $p.kv_events_listen) $listen) -}}
{{- fail (printf "config.epp.pool.kv_events_listen (%v): leave it out: the chart sets it to %q from epp.kvEventsPort" $p.kv_events_listen $listen) -}}
{{- end -}}
{{- $_ := set $p "kv_events_listen" $listen -}}
{{- end -}}
{{- $_ := set $epp "pool" $p -}}
{{- end -}}
{{- $_ := set $cfg "epp" $epp -}}
{{- toYaml $cfg -}}
{{- end }}

{{/* The picker's ServiceAccount. */}}
{{- define "inferrail.epp.serviceAccountName" -}}
{{- if .Values.epp.serviceAccount.create -}}
{{- .Values.epp.serviceAccount.name | default (include "inferrail.epp.fullname" .) -}}
{{- else -}}
{{- .Values.epp.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end }}

{{/* Environment of both containers. */}}
{{- define "inferrail.env" -}}
{{- $resources := .resources -}}
{{- if and $resources $resources.limits $resources.limits.memory }}
- name: GOMEMLIMIT
  valueFrom:
    resourceFieldRef:
      resource: limits.memory
{{- end }}
{{- with .root.Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Volume mounts of both containers: /etc/inferrail, /tmp and extras. */}}
{{- define "inferrail.volumeMounts" -}}
- name: config
  mountPath: /etc/inferrail
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Volumes of both pods: /etc/inferrail holds live.yaml from the ConfigMap
and admin-token from the Secret (one projected volume). Takes (dict "root"
$ "configMap" NAME).
*/}}
{{- define "inferrail.volumes" -}}
{{- $root := .root -}}
- name: config
  projected:
    defaultMode: 288 # 0440: the files belong to group fsGroup
    sources:
      - configMap:
          name: {{ .configMap }}
          items:
            - key: live.yaml
              path: live.yaml
      {{- with include "inferrail.adminToken.secretName" $root }}
      - secret:
          name: {{ . }}
          items:
            - key: {{ $root.Values.adminToken.key }}
              path: admin-token
      {{- end }}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- with $root.Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Scheduling of both pods. */}}
{{- define "inferrail.scheduling" -}}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
One ingress rule of a NetworkPolicy: the named container port .port, from
the peers .from (none: from anyone).
*/}}
{{- define "inferrail.ingressRule" -}}
- ports:
    - port: {{ .port }}
      protocol: TCP
  {{- with .from }}
  from:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
