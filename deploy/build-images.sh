#!/usr/bin/env bash
# Build the two images under the names deploy/k8s and docker-compose.yml use:
#   $REGISTRY/ivy:$TAG and $REGISTRY/tulip:$TAG   (deploy/images.env; TAG = pyproject.toml's version)
# Python packages come locked from deploy/constraints.txt, torch and CUDA from the base image images.env names.
#
#   deploy/build-images.sh                 build both
#   deploy/build-images.sh --push          build, then push both
#   deploy/build-images.sh --dry-run       print the docker commands instead (tests/test_deploy.py reads them)
#   FLASHINFER=1 deploy/build-images.sh    Tulip on the -devel base with FlashInfer, tagged $TAG-flashinfer
#                                          (compile its kernels ahead: deploy/RUNBOOK.md, "JIT kernels")
# REGISTRY=... or TAG=... in the environment override images.env / pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."

dry_run=0 push=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry_run=1 ;;
    --push) push=1 ;;
    *) echo "usage: $0 [--dry-run] [--push]" >&2; exit 2 ;;
  esac
done

registry_override=${REGISTRY:-}
# shellcheck source=deploy/images.env
. deploy/images.env
REGISTRY=${registry_override:-$REGISTRY}
TAG=${TAG:-$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)}
FLASHINFER=${FLASHINFER:-0}
flavour=runtime suffix=""
if [ "$FLASHINFER" = "1" ]; then flavour=devel suffix=-flashinfer; fi  # FlashInfer's JIT needs nvcc
TULIP_BASE_IMAGE="pytorch/pytorch:${TORCH_VERSION}-cuda${CUDA_VERSION}-cudnn${CUDNN_VERSION}-${flavour}"

run() {
  if [ "$dry_run" = 1 ]; then printf '%q ' "$@" | sed 's/ $//'; echo; else "$@"; fi
}

[ -n "$TAG" ] || { echo "no version in pyproject.toml" >&2; exit 1; }
run docker build -f deploy/Dockerfile.ivy --build-arg "BASE_IMAGE=${IVY_BASE_IMAGE}" -t "${REGISTRY}/ivy:${TAG}" .
run docker build -f deploy/Dockerfile.tulip --build-arg "BASE_IMAGE=${TULIP_BASE_IMAGE}" \
  --build-arg "FLASHINFER=${FLASHINFER}" -t "${REGISTRY}/tulip:${TAG}${suffix}" .
if [ "$push" = 1 ]; then
  run docker push "${REGISTRY}/ivy:${TAG}"
  run docker push "${REGISTRY}/tulip:${TAG}${suffix}"
fi
