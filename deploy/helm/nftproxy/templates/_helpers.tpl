{{/*
nftproxy.image is the image of both containers: repository@digest when a
digest is set, else repository:tag, the tag defaulting to appVersion.
*/}}
{{- define "nftproxy.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/*
nftproxy.checkNamespace refuses a release outside the ConfigMap's namespace
when the chart does not create it: a pod mounts only ConfigMaps of its own
namespace, and kubeadm's is in kube-system.
*/}}
{{- define "nftproxy.checkNamespace" -}}
{{- if and (not .Values.config.create) (ne .Release.Namespace "kube-system") -}}
{{- fail (printf "config.create is false: the proxy reads ConfigMap %s, which kubeadm writes in kube-system; install the release there (--namespace kube-system), or set config.create" .Values.config.configMapName) -}}
{{- end -}}
{{- if and .Values.config.create (not .Values.config.apiServer) -}}
{{- fail "config.apiServer: with config.create, the control plane's address (https://HOST:PORT) is required" -}}
{{- end -}}
{{- end -}}

{{/*
nftproxy.monitoringLabels are the labels deploy/monitoring's kustomization
gives every object it makes.
*/}}
{{- define "nftproxy.monitoringLabels" -}}
app.kubernetes.io/component: monitoring
app.kubernetes.io/name: nftproxy
{{- end -}}
