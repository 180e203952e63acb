#!/usr/bin/env bash
# Builds the real control plane the e2e suite runs against (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, kwok, helm) from the versions pinned in
# this folder's go.mod, into a cache outside the repo keyed by those versions.
# Only missing binaries are built, so a warm cache makes this a no-op.
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
# The stamp covers every pinned module (kwok, helm, etcd too): when it changes, rebuild all.
STAMP=$(cat go.mod go.sum etcd/main.go | sha256sum | cut -c1-16)
if [[ "$(cat "$BIN/.stamp" 2>/dev/null)" != "$STAMP" ]]; then
  rm -f "$BIN"/* "$BIN"/.*.tmp
  echo "$STAMP" >"$BIN/.stamp"
fi

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
)

LDFLAGS=$(version_ldflags)
for target in "${TARGETS[@]}"; do
  name=${target%%=*}
  pkg=${target#*=}
  if [[ -x $BIN/$name ]]; then
    continue
  fi
  echo "build.sh: building $name ($pkg)" >&2
  start=$SECONDS
  # Build to a temp name and rename, so an interrupted build never leaves a broken binary.
  "$GO" build -ldflags="$LDFLAGS" -o "$BIN/.$name.tmp" "$pkg"
  mv "$BIN/.$name.tmp" "$BIN/$name"
  echo "build.sh: built $name in $((SECONDS - start))s" >&2
done
echo "$BIN"
