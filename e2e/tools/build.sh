#!/usr/bin/env bash
# Builds the real control plane the e2e suite runs against (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, kwok, helm), the real node's kubelet and
# kube-proxy from the versions pinned in this folder's go.mod, and the autoscaling test's
# prometheus-adapter (pinned in prometheus-adapter/go.mod), into a cache outside the repo
# keyed by those versions. Only missing or stale binaries are built, so a warm cache makes this
# a no-op.
#
# Usage: bash e2e/tools/build.sh        # prints the bin directory on its last line
# Env:   BOOMERANG_CACHE (default $HOME/.cache/boomerang), GO (default: go)
set -euo pipefail
cd "$(dirname "$0")"

K8S_VERSION=v1.36.2
GO=${GO:-go}
CACHE=${BOOMERANG_CACHE:-$HOME/.cache/boomerang}
BIN=$CACHE/k8s-$K8S_VERSION/bin
mkdir -p "$BIN"
# Each binary carries two stamps of what it was built from. `.NAME.stamp` hashes go.mod and
# go.sum (and etcd's main): while it matches, nothing is looked at again. When it does not (a pin
# or a new tool changed go.mod), `.NAME.deps` decides: it hashes the module versions the binary's
# packages really come from (`go list -deps`), so only binaries whose modules changed rebuild.
MODULE_HASH=$(cat go.mod go.sum | sha256sum | cut -c1-16)
stamp_of() {
  if [[ $1 == etcd ]]; then
    cat go.mod go.sum etcd/main.go | sha256sum | cut -c1-16
  else
    echo "$MODULE_HASH"
  fi
}
deps_of() {  # name pkg ldflags
  {
    echo "$3"
    [[ $1 == etcd ]] && cat etcd/main.go
    "$GO" list -deps -f \
      '{{with .Module}}{{.Path}}@{{.Version}}{{with .Replace}}=>{{.Path}}@{{.Version}}{{end}}{{end}}' \
      "$2" | sort -u
  } | sha256sum | cut -c1-16
}

if ! command -v "$GO" >/dev/null; then
  echo "build.sh: Go is required (1.26.x); none found on PATH" >&2
  exit 1
fi
case "$("$GO" env GOVERSION)" in
  go1.26*) ;;
  *) echo "build.sh: warning: Go 1.26 is the tested toolchain (a 1.27 build served broken OpenAPI)" >&2 ;;
esac

export GOFLAGS="-trimpath -buildvcs=false ${GOFLAGS:-}"
export CGO_ENABLED=0

version_ldflags() {
  local major minor
  major=${K8S_VERSION#v}; major=${major%%.*}
  minor=${K8S_VERSION#v*.}; minor=${minor%%.*}
  local flags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$flags"
}

# name -> Go package, in build order (cheap ones first so a partial cache is still useful).
TARGETS=(
  "etcd=./etcd"
  "kwok=sigs.k8s.io/kwok/cmd/kwok"
  "helm=helm.sh/helm/v4/cmd/helm"
  "kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler"
  "kubectl=k8s.io/kubernetes/cmd/kubectl"
  "kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager"
  "kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver"
  # The real node (e2e/realnode.py); the control plane does not need them.
  "kube-proxy=k8s.io/kubernetes/cmd/kube-proxy"
  "kubelet=k8s.io/kubernetes/cmd/kubelet"
)

LDFLAGS=$(version_ldflags)
for target in "${TARGETS[@]}"; do
  name=${target%%=*}
  pkg=${target#*=}
  stamp=$(stamp_of "$name")
  old_stamp=$(cat "$BIN/.$name.stamp" 2>/dev/null || true)
  if [[ -x $BIN/$name && $old_stamp == "$stamp" && -s $BIN/.$name.deps ]]; then
    continue
  fi
  flags=$LDFLAGS
  if [[ $name == helm ]]; then
    flags+=" -X helm.sh/helm/v4/internal/version.version=$(awk '$1 == "helm.sh/helm/v4" {print $2}' go.mod)"
  fi
  deps=$(deps_of "$name" "$pkg" "$flags")
  # A matching go.mod/go.sum stamp vouches for the deps too (binaries from before .deps existed).
  if [[ -x $BIN/$name && ($old_stamp == "$stamp" || "$(cat "$BIN/.$name.deps" 2>/dev/null)" == "$deps") ]]; then
    echo "$deps" >"$BIN/.$name.deps"
    echo "$stamp" >"$BIN/.$name.stamp"
    continue
  fi
  echo "build.sh: building $name ($pkg)" >&2
  start=$SECONDS
  # Build to a temp name and rename, so an interrupted build never leaves a broken binary.
  "$GO" build -ldflags="$flags" -o "$BIN/.$name.tmp" "$pkg"
  mv "$BIN/.$name.tmp" "$BIN/$name"
  echo "$deps" >"$BIN/.$name.deps"
  echo "$stamp" >"$BIN/.$name.stamp"
  echo "build.sh: built $name in $((SECONDS - start))s" >&2
done

# prometheus-adapter, the external metrics API of the autoscaling test: its own module
# (prometheus-adapter/), so its Kubernetes libraries never move the control plane's pins;
# keyed by that module's go.mod and go.sum.
adapter_stamp=$(cat prometheus-adapter/go.mod prometheus-adapter/go.sum | sha256sum | cut -c1-16)
if [[ ! -x $BIN/prometheus-adapter || "$(cat "$BIN/.prometheus-adapter.stamp" 2>/dev/null)" != "$adapter_stamp" ]]; then
  echo "build.sh: building prometheus-adapter (sigs.k8s.io/prometheus-adapter/cmd/adapter)" >&2
  start=$SECONDS
  (cd prometheus-adapter &&
    "$GO" build -ldflags="-s -w" -o "$BIN/.prometheus-adapter.tmp" sigs.k8s.io/prometheus-adapter/cmd/adapter)
  mv "$BIN/.prometheus-adapter.tmp" "$BIN/prometheus-adapter"
  echo "$adapter_stamp" >"$BIN/.prometheus-adapter.stamp"
  echo "build.sh: built prometheus-adapter in $((SECONDS - start))s" >&2
fi

# kwok ships no default behaviour in its binary: it needs Stage objects. Use the ones its own
# release defines (kwokctl's defaults: fast node init, lease heartbeat, fast pod lifecycle),
# taken from the pinned module so they always match the binary.
if [[ ! -s $BIN/kwok-stages.yaml || $BIN/kwok -nt $BIN/kwok-stages.yaml ]]; then
  stages=$("$GO" list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
    pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    echo "---"
    cat "$stages/$f"
  done >"$BIN/.kwok-stages.tmp"
  mv "$BIN/.kwok-stages.tmp" "$BIN/kwok-stages.yaml"
fi
echo "$BIN"
