{{- define "boomerang.name" -}}boomerang-operator{{- end -}}

{{- define "boomerang.serviceAccountName" -}}
{{- default "boomerang-operator" .Values.serviceAccount.name -}}
{{- end -}}

{{- define "boomerang.labels" -}}
app.kubernetes.io/name: boomerang
app.kubernetes.io/component: operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "boomerang.selectorLabels" -}}
app.kubernetes.io/name: boomerang
app.kubernetes.io/component: operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
