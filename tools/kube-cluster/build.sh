#!/usr/bin/env bash
# Builds the upstream Kubernetes components of gpupool's test bed from their pinned Go modules
# into a cache folder keyed by this folder's go.mod/go.sum files, main sources, the build flags
# and the Go version, and prints that bin folder on stdout (progress goes to stderr).
#
#   tools/kube-cluster/build.sh                 # the control plane: apiserver, controller-manager,
#                                               # scheduler, kubectl, etcd, kwok
#   tools/kube-cluster/build.sh kueue kubelet   # only these (each is built once, then cached)
#
# A binary already in the cache is not built again, so a second run prints the folder at once.
# GPUPOOL_KUBE_CACHE moves the cache (default ~/.cache/gpupool/kube-cluster).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0

command -v go >/dev/null || { echo "build.sh: 'go' is not on PATH; install Go 1.26 to build the test bed" >&2; exit 2; }

default=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok)
all=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet etcd kwok kueue)
wanted=("$@")
[ ${#wanted[@]} -gt 0 ] || wanted=("${default[@]}")
for name in "${wanted[@]}"; do
  case " ${all[*]} " in *" $name "*) ;; *)
    echo "build.sh: unknown component '$name'; choose from: ${all[*]}" >&2; exit 2 ;;
  esac
done

flags=(-trimpath "-ldflags=-s -w")
# The release stamped as Kubernetes' own build does (hack/lib/version.sh): without it the
# binaries call themselves v0.0.0-master, which clients and version checks read.
release="$(cd "$here" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
minor="${release#v1.}"; minor="${minor%%.*}"
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  stamp+=" -X $pkg.gitVersion=$release -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitCommit= -X $pkg.gitTreeState=clean"
done

# The cache key: what the binaries are made of (Go, flags, pins, mains), not this script's text.
key="$(cd "$here" && { go env GOVERSION; echo "${flags[*]} $stamp"; find . \( -name go.mod -o -name go.sum -o -name '*.go' \) -type f | LC_ALL=C sort | xargs sha256sum; } | sha256sum | cut -c1-16)"
cache="${GPUPOOL_KUBE_CACHE:-$HOME/.cache/gpupool/kube-cluster}/$key"
bin="$cache/bin"
mkdir -p "$bin"

list_missing() { missing=(); for name in "${wanted[@]}"; do [ -x "$bin/$name" ] || missing+=("$name"); done; }
# Everything there: no lock (another run may be building an extra component meanwhile).
list_missing
if [ ${#missing[@]} -eq 0 ]; then echo "$bin"; exit 0; fi
# One build at a time per cache folder (a test run and `make cluster-up` may start together);
# what the other built is not built again.
exec 9>"$cache/.lock"
flock 9
list_missing
if [ ${#missing[@]} -eq 0 ]; then echo "$bin"; exit 0; fi

tmp="$(mktemp -d "$cache/.build-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# Where each component's main package lives: the Kubernetes ones in this module (small mains),
# etcd in its own module (a main around etcdmain), kwok and Kueue as tools of their own modules
# (each pins a Kubernetes client release of its own, so they do not share this go.mod).
k8s=()
for name in "${missing[@]}"; do
  case "$name" in
    kube-*|kubectl|kubelet) k8s+=("./cmd/$name") ;;
  esac
done
start=$SECONDS
if [ ${#k8s[@]} -gt 0 ]; then
  echo "build.sh: building ${k8s[*]} $release (cold: tens of minutes on 2 cores)" >&2
  (cd "$here" && go build -trimpath "-ldflags=-s -w$stamp" -o "$tmp/" "${k8s[@]}")
fi
for name in "${missing[@]}"; do
  case "$name" in
    etcd) echo "build.sh: building etcd" >&2
          (cd "$here/etcd" && go build "${flags[@]}" -o "$tmp/etcd" .) ;;
    kwok) echo "build.sh: building kwok" >&2
          (cd "$here/kwok" && go build "${flags[@]}" -o "$tmp/kwok" sigs.k8s.io/kwok/cmd/kwok) ;;
    kueue) echo "build.sh: building kueue" >&2
           (cd "$here/kueue" && go build "${flags[@]}" -o "$tmp/kueue" sigs.k8s.io/kueue/cmd/kueue) ;;
  esac
done
# Each binary lands by rename, so a folder never holds a half-written one.
for name in "${missing[@]}"; do mv "$tmp/$name" "$bin/$name"; done
echo "build.sh: built ${missing[*]} in $((SECONDS - start)) s into $bin" >&2
echo "$bin"
