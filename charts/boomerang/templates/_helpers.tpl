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

{{- /* Cluster-scoped objects and per-namespace Roles are named after the release, so that two
releases (say one per team, each watching its own namespaces) never claim the same object. */ -}}
{{- define "boomerang.releaseName" -}}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "boomerang.peeringName" -}}
{{- default (include "boomerang.releaseName" .) .Values.leaderElection.name -}}
{{- end -}}

{{- /* What the operator does to its resources and their children, wherever it watches: read
and annotate its resource (kopf's progress), write its status, server-side apply the children
it owns (get/list/watch to follow them, create/patch to apply; never delete: garbage collection
does), and post events. Secrets: create only, for each deployment's lease token (created blind,
an existing one answers 409): the operator never reads a Secret. EndpointSlice read is here because the operator grants it to each
router's Role, and Kubernetes only lets a subject grant permissions it holds itself. */ -}}
{{- define "boomerang.workloadRules" -}}
- apiGroups: ["boomerang.dev"]
  resources: ["disaggregateddeployments"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["boomerang.dev"]
  resources: ["disaggregateddeployments/status"]
  verbs: ["get", "patch"]
- apiGroups: ["boomerang.dev"]
  resources: ["disaggregateddeployments/finalizers"]
  verbs: ["update"]
- apiGroups: ["boomerang.dev"]
  resources: ["disaggregatedrolescalers"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["boomerang.dev"]
  resources: ["disaggregatedrolescalers/status"]
  verbs: ["get", "patch"]
- apiGroups: ["apps"]
  resources: ["statefulsets", "deployments"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["services", "configmaps", "serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create"]
{{- end -}}

{{- /* kopf's peering: list and watch the peering objects for the other replicas' heartbeats,
patch its own one with its heartbeat. Called with (list $ "clusterkopfpeerings"). */ -}}
{{- define "boomerang.peeringRules" -}}
{{- $root := index . 0 -}}
- apiGroups: ["kopf.dev"]
  resources: [{{ index . 1 | quote }}]
  verbs: ["list", "watch"]
- apiGroups: ["kopf.dev"]
  resources: [{{ index . 1 | quote }}]
  resourceNames: [{{ include "boomerang.peeringName" $root | quote }}]
  verbs: ["get", "patch"]
{{- end -}}
