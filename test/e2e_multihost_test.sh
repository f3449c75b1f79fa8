#!/usr/bin/env bash
# A multi-host job: the coordinator, two servers and two workers on five
# "hosts", each a network namespace with one veth link to a switch namespace
# that holds a bridge (10.77.K.0/24, K random; namespaces named after this
# shell's PID; all created here and removed on exit, also on failure). Every
# daemon runs inside its host's namespace, so all traffic between them
# crosses the links, which carry added latency and a bandwidth limit. The
# same small job (MLP 784-64-10 cut into 64 KiB chunks so that both servers
# carry traffic, batch 32, $STEPS steps, 2 servers, 2 workers) runs in sync
# and in async, each also on loopback (127.0.0.1, no namespaces, no latency,
# no limit) in the same test run, as the yardstick. Checks that every process
# exits 0, that each job completes (every worker finished all its steps, the
# shards applied the updates the mode implies and serve at the addresses
# expected, the final evaluation is present) with test accuracy >=
# $MIN_ACCURACY, that the workers on the hosts send their values through
# gRPC (each shard refuses their shared-memory lanes: they are in another
# network namespace, although they share this machine's PIDs; the loopback
# yardstick asks for gRPC outright, so that it measures loopback TCP), that
# sync on the hosts ends with the very model sync on
# loopback does (the same final test loss and accuracy: latency changes when
# a step completes, not what it computes; with two workers the sum of their
# gradients is the same in either order of arrival), and that the workers'
# traffic went through the shaped links. Prints the wall time and samples/s
# of each run beside its loopback yardstick: timings are noisy on a shared
# machine, so they are printed, never asserted.
#
# The links (per host, each direction):
#   - bandwidth: htb at $RATE (1 Gbit/s, 15 KB bursts) on both ends of the
#     host's veth (the host's egress and its switch port's egress). Each
#     step moves the whole model (~200 KB of f32) up and down each worker's
#     link: ~1.6 ms each way at 1 Gbit/s, about a loopback step's whole time,
#     so the limit is felt (htb's overlimits, printed per run, are far from
#     0). htb rather than tbf: tbf cuts every 64 KB GSO packet into 1500-byte
#     segments, which cost 5x the kernel CPU on a 2-core machine; a 200 KB
#     request and its 200 KB reply took 3.1 ms through htb (ideal: 3.2 ms).
#   - latency: $DELAY_MS ms (2 ms) one way between any two hosts, so every
#     request/response between two hosts takes 2 x $DELAY_MS = 4 ms more (a
#     step makes at least one such round trip to each shard):
#       * with `tc netem delay 2ms` under the htb class of every host's
#         egress when the kernel has netem (probed in this test's own
#         namespace);
#       * otherwise, and on the kernel this test was written on (no netem:
#         "Specified qdisc kind is unknown"), in user space:
#         grps-delay-relay (test/delay_relay.cc) in front of each listening
#         daemon (the coordinator and both servers), inside that daemon's
#         namespace. The daemon listens on its host's 127.0.0.1, the relay
#         on the host's address; the servers advertise the relay's address,
#         so every connection between hosts crosses exactly one relay, which
#         holds each chunk $DELAY_MS ms in each direction (order kept, no
#         throughput limit of its own: ~700 MB/s through a 2 ms relay,
#         measured, far above the links' 125 MB/s). The relays' CPU is part
#         of what the namespace runs cost.
#     GRPS_MH_LATENCY=netem|relay|none overrides the choice (none: the
#     daemons listen on their host addresses directly; bandwidth limit only).
set -euo pipefail
BIN=${1:?usage: e2e_multihost_test.sh BIN_DIR}
source "$(dirname "$0")/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
# 77: ctest reports the test as skipped, not passed.
[ -d "$DATA" ] || { echo "SKIP: $DATA missing (apt-get install dataset-fashion-mnist)"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "SKIP: network namespaces need root"; exit 77; }
command -v ip >/dev/null && command -v tc >/dev/null ||
  { echo "SKIP: ip and tc (iproute2) are missing"; exit 77; }

STEPS=1000
# Loopback runs of this job reached 0.8545 in sync (every time: see below)
# and 0.81 to 0.85 in async; 0.7 is well above chance (0.1) with room for
# the run-to-run spread of async.
MIN_ACCURACY=0.7
source "$(dirname "$0")/netns_hosts.sh"

# run_job PLACE MODE: runs the job on PLACE (loopback or hosts) under MODE
# and checks it; appends its figures to $WORK/results.
run_job() {
  local place=$1 mode=$2 run=$1-$2
  local h name before=() after
  if [ "$place" = hosts ]; then
    for h in "${HOSTS[@]}"; do before+=("$(shaper_counters "$h")"); done
  fi
  local t0=$SECONDS
  local transport=shm
  [ "$place" = loopback ] && transport=grpc
  serve "$place" "$run-coordinator" coord 7070 - "$BIN/grps-coordinator" \
    --job_id="$run" --mode="$mode" --servers=2 --workers=2 --steps=$STEPS --batch=32 \
    --local_transport=$transport \
    --train_limit=6000 --test_limit=2000 --eval_every=100 --hidden=64 --chunk_kb=64 \
    --heartbeat_ms=200 --heartbeat_timeout_ms=3000 --linger_ms=3000
  local coord=$ADDRESS
  serve "$place" "$run-server-0" s0 7071 --advertise_address "$BIN/grps-server" --coordinator="$coord"
  local server0=$ADDRESS
  serve "$place" "$run-server-1" s1 7071 --advertise_address "$BIN/grps-server" --coordinator="$coord"
  local server1=$ADDRESS
  for w in 0 1; do
    start "$run-worker-$w" on "$place" "w$w" "$BIN/grps-worker" --coordinator="$coord" \
      --backend=cpu
  done
  # The last snapshot of the job (the coordinator exits when it is done).
  start "$run-watch" on "$place" coord "$BIN/grpsctl" --coordinator="$coord" --json \
    --interval_ms=200 watch
  local daemons=(worker-0 worker-1 server-0 server-1 coordinator watch)
  for name in "${daemons[@]}"; do
    local pid_var=PID_${run//-/_}_${name//-/_}
    wait_pid "${!pid_var}" 240
    [ "$EXIT_CODE" = 0 ] || fail "$run: $name exited with $EXIT_CODE"
  done
  local launch_to_exit=$((SECONDS - t0))
  if [ "$place" = hosts ]; then
    for w in 0 1; do
      local refused
      refused=$(grep -c "cannot use this worker's shared-memory lane" "$WORK/$run-worker-$w.log" || true)
      [ "$refused" = 2 ] ||
        fail "$run: worker $w was refused the lane by $refused of 2 shards (see $run-worker-$w.log)"
      grep -q "another network namespace" "$WORK/$run-worker-$w.log" ||
        fail "$run: worker $w's lane was refused for another reason"
    done
  fi
  local relayed=0
  if [ "$place" = hosts ] && [ "$LATENCY" = relay ]; then
    # The daemons are gone, so the relays' connections have ended: stop the
    # relays and read what each carried.
    end_relays "$run-coordinator" "$run-server-0" "$run-server-1"
    relayed=$(cat "$WORK/$run"-*-relay.log | awk '/closed:/ {s += $4 + $9} END {print s + 0}')
  fi
  local links=""
  if [ "$place" = hosts ]; then
    local i=0
    for h in "${HOSTS[@]}"; do
      after=$(shaper_counters "$h")
      links+="$h:$(python3 -c "import sys; b0, o0, b1, o1 = map(int, sys.argv[1:]); print(f'{(b1 - b0) / 2**20:.0f}MiB/{o1 - o0}')" \
        ${before[$i]} $after) "
      i=$((i + 1))
    done
  fi

  grep '^{' "$WORK/$run-watch.log" | tail -n 1 >"$WORK/$run-final.json"
  python3 - "$WORK/$run-final.json" "$STEPS" "$mode" "$place" "$server0" "$server1" \
    "$MIN_ACCURACY" "$launch_to_exit" "$relayed" "$links" >>"$WORK/results" <<'PY' ||
import json, sys
path, steps, mode, place, server0, server1, min_accuracy, launch_to_exit, relayed, links = sys.argv[1:]
steps = int(steps)
j = json.load(open(path))
def check(cond, what):
    if not cond:
        print(f"{place} {mode}: final check failed: {what}", json.dumps(j, indent=1)[:3000],
              file=sys.stderr)
        sys.exit(1)
check(j["state"] == "JOB_STATE_COMPLETED", "state completed")
check(j["mode"] == "MODE_" + mode.upper(), f"mode {mode}")
workers = j["workers"]
check(sorted(w["rank"] for w in workers) == [0, 1], "two workers")
for w in workers:
    check(w["state"] == "MEMBER_STATE_FINISHED", "worker finished")
    check(int(w["progress"]["step"]) == steps, f"worker at step {steps}")
shards = j["shards"]
check(sorted(s["address"] for s in shards) == sorted([server0, server1]),
      f"the shards serve at {server0} and {server1}")
for s in shards:
    chunks = int(s["num_chunks"])
    # sync: one update per chunk per step; async: one per chunk per push.
    updates = steps * chunks * (1 if mode == "sync" else len(workers))
    check(int(s["updates_applied"]) == updates, f"updates applied = {updates}")
    check(int(s.get("rejected_pushes", 0)) == 0, "no rejected pushes")
check(j.get("has_final_eval") is True, "final evaluation present")
accuracy = float(j["final_test_accuracy"])
check(accuracy >= float(min_accuracy), f"final test accuracy {accuracy} >= {min_accuracy}")
wall = float(j["elapsed_seconds"])
samples = sum(int(w["progress"]["samples"]) for w in workers)
# One line of figures: place mode wall samples/s accuracy launch-to-exit relayed links
print(place, mode, f"{wall:.2f}", f"{samples / wall:.0f}", f"{accuracy:.4f}", launch_to_exit,
      relayed, links.strip() or "-", sep="\t")
PY
    fail "$run: the final status is wrong"
  echo "$run: $(tail -n 1 "$WORK/results" | cut -f3-5 | tr '\t' ' ') (wall s, samples/s, accuracy)"
}

# Interleaved, so that the machine's load falls alike on a run and its
# yardstick.
for mode in sync async; do
  run_job loopback "$mode"
  run_job hosts "$mode"
done

python3 - "$WORK/results" "$LATENCY" "$DELAY_MS" "$RATE" "$WORK" <<'PY' ||
import json, sys
path, latency, delay_ms, rate, work = sys.argv[1:]
rows = [line.rstrip("\n").split("\t") for line in open(path)]
by = {(r[0], r[1]): r for r in rows}
print()
added = "no added latency" if latency == "none" else f"{delay_ms} ms one way between hosts ({latency})"
print(f"5 hosts: {added}, htb {rate} per host link each way; loopback: 127.0.0.1, no namespaces")
print(f"{'mode':6} {'where':9} {'wall s':>7} {'samples/s':>10} {'x loopback':>10} "
      f"{'accuracy':>8} {'launch-exit s':>13}")
ok = True
for mode in ("sync", "async"):
    base = by[("loopback", mode)]
    for place in ("loopback", "hosts"):
        r = by[(place, mode)]
        slower = float(r[2]) / float(base[2])
        print(f"{mode:6} {place:9} {r[2]:>7} {r[3]:>10} {slower:>9.2f}x {r[4]:>8} {r[5]:>13}")
    hosts = by[("hosts", mode)]
    if latency == "relay":
        print(f"       relays carried {int(hosts[6]) / 2**20:.0f} MiB")
    print(f"       host egress (MiB/htb overlimits): {hosts[7]}")
    # Each worker pushes and pulls the whole model every step: its link
    # carries MiBs. None: the daemons talked some other way.
    for link in hosts[7].split():
        host, figures = link.split(":")
        if host.startswith("w") and float(figures.split("MiB")[0]) < 10:
            print(f"{mode}: worker link {host} carried only {figures}", file=sys.stderr)
            ok = False
finals = [json.load(open(f"{work}/{place}-sync-final.json")) for place in ("loopback", "hosts")]
outcome = [(f["final_test_accuracy"], f["final_test_loss"]) for f in finals]
if outcome[0] != outcome[1]:
    print(f"sync on the hosts ended with test accuracy, loss {outcome[1]}, "
          f"on loopback with {outcome[0]}", file=sys.stderr)
    ok = False
sys.exit(0 if ok else 1)
PY
  fail "the runs disagree (above)"
[ "$LATENCY" = none ] && added="no added latency" || added="$DELAY_MS ms one way by $LATENCY"
echo "PASS: sync and async complete on 5 namespace hosts ($added, $RATE) in $SECONDS s"
