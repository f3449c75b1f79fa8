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
# must restore that checkpoint from its own claim. The dev overlay runs a
# second time with the workers' Job scaled up from 2 to 3 mid-job (pod
# grps-worker-2 must join the running job), then pod grps-worker-1 evicted
# (SIGTERM), as a scale-down of the workers' Job does: it must leave the job
# after its step and exit 0, and the job must complete without it.
# The scaling overlay (the dev job with GRPS_MAX_SERVERS=3 and its
# checkpoints on one shared claim) runs with its servers scaled 2 -> 3 -> 1
# as deploy/README.md says, each step after a newer checkpoint: the
# StatefulSet scaled to 3 (pod grps-server-2 starts and stands by), then
# `grpsctl scale --servers=3 --wait` exec'd in the coordinator's pod, then
# `grpsctl scale --servers=1 --wait` (grps-server-1 and -2 retire and exit
# 0), then the StatefulSet scaled to 1. The coordinator must log both moves,
# and the job complete with test accuracy >= 0.7 and a checkpoint of 1
# shard.
# The lookup overlay's pods run too: a job of sparse rows and the lookup
# service (grps-server --serve) on its checkpoint claim; the service must
# become ready, serve the job's newest checkpoint, and exit 0 on SIGTERM.
# Then the torch overlay's pods run the same way, with a script of the
# user's own given as deploy/README.md says (a ConfigMap mounted as the
# script: here examples/torch/fashion_cnn.py, 1 epoch of 12,000 examples):
# the workers are Python processes (grps.torch from BIN/../python), and
# the job must complete with test accuracy >= 0.6 and a checkpoint. That
# part is skipped, and said so, without the build's grps Python package or
# Debian's PyTorch.
# test/deploy_pods.py does the work and says what it checks.
# With GRPS_IMAGE=grps:cpu (deploy/build-image; root, podman) the dev
# overlay's pods run in that image instead: its binaries, its user, its
# libraries, /etc/hosts for the DNS names (CI does this after
# deploy/build-image); with GRPS_TORCH_IMAGE=grps:torch
# (deploy/build-image --torch) the torch overlay's run in that one; with
# GRPS_IMAGE alone they do not run (they would run from the build, as they
# do without GRPS_IMAGE).
# Usage: deploy_pods_test.sh BIN_DIR [DEPLOY_DIR (default: the repository's deploy/)]
set -euo pipefail
BIN=${1:?usage: deploy_pods_test.sh BIN_DIR [DEPLOY_DIR]}
HERE=$(cd "$(dirname "$0")" && pwd)
DEPLOY=${2:-$HERE/../deploy}
EXAMPLES=$HERE/../examples
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
  --examples "$EXAMPLES" --work "$WORK/pods" "${checks[@]}" --run "$WORK/dev.yaml" \
  --timeout 150 --min_accuracy 0.7 --restart grps-server-1 \
  ${GRPS_IMAGE:+--image "$GRPS_IMAGE"} &
PIDS+=($!)
wait $! || fail "test/deploy_pods.py failed (its FAIL lines are above)"

# The workers' Job scaled up, then down, while the job trains (an elastic
# job: the base's GRPS_MAX_WORKERS): once a checkpoint is complete the Job
# goes from 2 to 3 completions and parallelism, as `kubectl patch job
# grps-worker` does to an elastic indexed Job, and pod grps-worker-2 starts
# and must join the running job; after a later checkpoint pod grps-worker-1
# gets SIGTERM (a scale-down, or an eviction). It must leave the job after
# its step and exit 0 (the Job counts it done), and the others must complete
# the job without waiting for a heartbeat timeout.
/usr/bin/python3 "$HERE/deploy_pods.py" --bin "$BIN" --secrets "$WORK/secrets/secrets.yaml" \
  --examples "$EXAMPLES" --work "$WORK/pods-evict" --run "$WORK/dev.yaml" \
  --timeout 150 --min_accuracy 0.7 --scale grps-worker=3 --evict grps-worker-1 \
  ${GRPS_IMAGE:+--image "$GRPS_IMAGE"} &
PIDS+=($!)
wait $! || fail "test/deploy_pods.py --evict failed (its FAIL lines are above)"

# The servers' StatefulSet scaled up and down while the job trains (the
# scaling overlay): each `grpsctl scale` runs in the coordinator's pod, as
# `kubectl exec deploy/grps-coordinator -- ...` would, with its admin token.
[ -s "$WORK/scaling.yaml" ] || fail "no scaling overlay in $DEPLOY/overlays"
grpsctl_scale=(deploy/grps-coordinator -- /usr/local/bin/grpsctl --coordinator=127.0.0.1:7070
               scale --wait --wait_s=60)
/usr/bin/python3 "$HERE/deploy_pods.py" --bin "$BIN" --secrets "$WORK/secrets/secrets.yaml" \
  --examples "$EXAMPLES" --work "$WORK/pods-scaling" --run "$WORK/scaling.yaml" \
  --timeout 150 --min_accuracy 0.7 \
  --scale grps-server=3 --exec "${grpsctl_scale[*]} --servers=3" \
  --exec "${grpsctl_scale[*]} --servers=1" --scale grps-server=1 \
  ${GRPS_IMAGE:+--image "$GRPS_IMAGE"} &
PIDS+=($!)
wait $! || fail "test/deploy_pods.py with the servers scaled failed (its FAIL lines are above)"
for move in "2 to 3" "3 to 1"; do
  grep -q "re-sharded from $move shards" "$WORK/pods-scaling/grps-coordinator-0.log" ||
    fail "the coordinator did not log 're-sharded from $move shards'"
done

# The lookup overlay: a job of sparse rows with incremental checkpoints on
# a shared claim, and the lookup service (grps-server --serve) on that
# claim, read-only (deploy/README.md, "Serving rows to inference"): the
# service's pod must become ready (a checkpoint served) and scrapable, serve
# the job's newest checkpoint once the job has ended, and exit 0 on SIGTERM.
[ -s "$WORK/lookup.yaml" ] || fail "no lookup overlay in $DEPLOY/overlays"
/usr/bin/python3 "$HERE/deploy_pods.py" --bin "$BIN" --secrets "$WORK/secrets/secrets.yaml" \
  --examples "$EXAMPLES" --work "$WORK/pods-lookup" --run "$WORK/lookup.yaml" \
  --timeout 150 --min_accuracy 0.5 ${GRPS_IMAGE:+--image "$GRPS_IMAGE"} &
PIDS+=($!)
wait $! || fail "test/deploy_pods.py on the lookup overlay failed (its FAIL lines are above)"

# The torch overlay with the user's script from a ConfigMap: the overlay a
# user writes (deploy/README.md, "Your own PyTorch script"), with
# fashion_cnn.py as their train.py.
if [ -n "${GRPS_IMAGE:-}" ] && [ -z "${GRPS_TORCH_IMAGE:-}" ]; then
  # Nothing of GRPS_IMAGE's runs there: the run without GRPS_IMAGE (ctest's)
  # runs the same pods from the build.
  echo "PASS (the torch overlay's pods did not run: GRPS_IMAGE without GRPS_TORCH_IMAGE)"
  exit 0
fi
if [ -z "${GRPS_TORCH_IMAGE:-}" ] && [ ! -f "$BIN/../python/grps/__init__.py" ]; then
  echo "PASS (the torch overlay's pods did not run: no grps Python package in $BIN/../python)"
  exit 0
fi
if [ -z "${GRPS_TORCH_IMAGE:-}" ] && ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "PASS (the torch overlay's pods did not run: /usr/bin/python3 has no torch)"
  exit 0
fi
[ -d "$DEPLOY/overlays/torch" ] || fail "no torch overlay in $DEPLOY/overlays"
mkdir "$WORK/my-job"
cat >"$WORK/my-job/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- $(realpath --relative-to="$WORK/my-job" "$DEPLOY/overlays/torch")
configMapGenerator:
- name: grps-script
  files:
  - train.py=$EXAMPLES/torch/fashion_cnn.py
patches:
- patch: |-
    apiVersion: batch/v1
    kind: Job
    metadata:
      name: grps-worker
    spec:
      template:
        spec:
          containers:
          - name: worker
            command: [/usr/bin/python3, /opt/grps/script/train.py,
                      --epochs=1, --train_limit=12000, --threads=1]
            volumeMounts:
            - name: script
              mountPath: /opt/grps/script
              readOnly: true
          volumes:
          - name: script
            configMap:
              name: grps-script
EOF
kubectl kustomize --load-restrictor LoadRestrictionsNone "$WORK/my-job" >"$WORK/my-job.yaml" ||
  fail "kubectl kustomize of the torch overlay with a script of one's own failed"
/usr/bin/python3 "$HERE/deploy_pods.py" --bin "$BIN" --secrets "$WORK/secrets/secrets.yaml" \
  --examples "$EXAMPLES" --work "$WORK/torch-pods" --run "$WORK/my-job.yaml" \
  --timeout 120 --min_accuracy 0.6 \
  ${GRPS_TORCH_IMAGE:+--image "$GRPS_TORCH_IMAGE"} &
PIDS+=($!)
wait $! || fail "test/deploy_pods.py failed on the torch overlay (its FAIL lines are above)"
echo "PASS"
