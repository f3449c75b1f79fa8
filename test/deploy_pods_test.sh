#!/usr/bin/env bash
# deploy/'s manifests run for real, without a cluster: every overlay is
# rendered with `kubectl kustomize`; the GRPS_* variables and flags of every
# container of every overlay must name flags of its own binary (a daemon
# ignores a misspelled variable silently); then the dev overlay's pods (the
# coordinator, the servers of the StatefulSet, the workers of the indexed
# Job) run as local processes with their containers' own commands and
# environments, each pod on a loopback address of its own, with the Secrets
# of deploy/make-secrets (tokens, mutual TLS). Their exec probes must pass,
# their metrics must be scrapable, and the job must complete (every pod
# exits 0) with test accuracy >= 0.7 and a checkpoint whose manifest is on
# the coordinator's claim and each shard's file on its own pod's claim.
# Once a checkpoint is complete, pod grps-server-1 is killed (SIGKILL) and
# started again as its StatefulSet would (same name, ordinal and claim): it
# must restore that checkpoint from its own claim.
# test/deploy_pods.py does the work and says what it checks.
# With GRPS_IMAGE=grps:cpu (deploy/build-image; root, podman) the pods run in
# that image instead: its binaries, its user, its libraries, /etc/hosts
# for the DNS names (CI does this after deploy/build-image).
# Usage: deploy_pods_test.sh BIN_DIR [DEPLOY_DIR (default: the repository's deploy/)]
set -euo pipefail
BIN=${1:?usage: deploy_pods_test.sh BIN_DIR [DEPLOY_DIR]}
HERE=$(cd "$(dirname "$0")" && pwd)
DEPLOY=${2:-$HERE/../deploy}
source "$HERE/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
[ -d "$DATA" ] || { echo "SKIP: $DATA missing (apt-get install dataset-fashion-mnist)"; exit 77; }
command -v kubectl >/dev/null || { echo "SKIP: kubectl missing (it renders the overlays)"; exit 77; }
/usr/bin/python3 -c 'import yaml' 2>/dev/null || fail "python3-yaml missing (scripts/setup installs it)"

checks=()
for overlay in "$DEPLOY"/overlays/*/; do
  name=$(basename "$overlay")
  # Bazel's runfiles are symlinks out of the overlay's folder.
  kubectl kustomize --load-restrictor LoadRestrictionsNone "$overlay" >"$WORK/$name.yaml" ||
    fail "kubectl kustomize $overlay failed"
  [ "$name" = dev ] || checks+=(--check "$WORK/$name.yaml")
done
[ -s "$WORK/dev.yaml" ] || fail "no dev overlay in $DEPLOY/overlays"
"$DEPLOY/make-secrets" "$WORK/secrets" >/dev/null

/usr/bin/python3 "$HERE/deploy_pods.py" --bin "$BIN" --secrets "$WORK/secrets/secrets.yaml" \
  --work "$WORK/pods" "${checks[@]}" --run "$WORK/dev.yaml" --timeout 150 --min_accuracy 0.7 \
  --restart grps-server-1 \
  ${GRPS_IMAGE:+--image "$GRPS_IMAGE"} &
PIDS+=($!)
wait $! || fail "test/deploy_pods.py failed (its FAIL lines are above)"
echo "PASS"
