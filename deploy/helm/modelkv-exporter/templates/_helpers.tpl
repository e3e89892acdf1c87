{{- /* Labels every object of the chart carries: the kustomize base's, Helm's, and the release label. */ -}}
{{- define "modelkv-exporter.labels" -}}
app.kubernetes.io/name: modelkv-exporter
app.kubernetes.io/part-of: modelkv-exporter
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
{{- end }}

{{- /* Replace every token of the rule file's strings (files/modelkv-rules.yaml) by its value. */ -}}
{{- define "modelkv-exporter.fill" -}}
{{- $text := .text }}
{{- range $token, $value := .values }}
{{- $text = replace $token $value $text }}
{{- end }}
{{- $text }}
{{- end }}

{{- /* The relabelings that keep one shard's pods, by the hashmod of their node (podMonitor.nodeShards > 1). */ -}}
{{- define "modelkv-exporter.nodeShard" -}}
{{- $shards := int .Values.podMonitor.nodeShards }}
{{- $shard := int .Values.podMonitor.nodeShard }}
{{- if ge $shard $shards }}
{{- fail (printf "podMonitor.nodeShard is %d, but the shards are numbered 0 to %d (podMonitor.nodeShards - 1)" $shard (sub $shards 1)) }}
{{- end }}
{{- if gt $shards 1 }}
- action: hashmod
  sourceLabels: [__meta_kubernetes_pod_node_name]
  modulus: {{ $shards }}
  targetLabel: __tmp_modelkv_node_shard
- action: keep
  sourceLabels: [__tmp_modelkv_node_shard]
  regex: {{ $shard | quote }}
{{- end }}
{{- end }}
