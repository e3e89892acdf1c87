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
