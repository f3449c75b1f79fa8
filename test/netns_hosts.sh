# Network-namespace "hosts" on this machine, for tests and benchmarks that
# need a network between their daemons (test/e2e_multihost_test.sh explains
# the set-up and its figures; scripts/torch-multihost and
# scripts/cross-host-bench use it too). Each host is a network namespace with
# one veth link to a switch namespace that holds a bridge (10.77.K.0/24, K
# random; namespaces named after the sourcing shell's PID; all created when
# this file is sourced and removed on exit, also on failure). Every link is
# shaped: htb at $RATE each way, and $DELAY_MS ms one way between hosts
# (netem where the kernel has it, else grps-delay-relay in front of each
# listening daemon; GRPS_MH_LATENCY=netem|relay|none; DELAY_MS=0 adds no
# delay at all: none, whatever GRPS_MH_LATENCY says). Every host's TCP uses
# the congestion control $TCP_CC (each namespace's
# net.ipv4.tcp_congestion_control; one this kernel allows in a namespace,
# tcp_allowed_congestion_control) if set, else what a new namespace inherits
# from the machine's.
#
# The hosts are the five coord s0 s1 w0 w1 unless the caller sets the array
# HOSTS before sourcing (e.g. HOSTS=(coord s0 s1 s2 s3 w0 w1 w2 w3); names
# of at most 13 characters, not "sw", the switch's).
#
# Source after test/lib.sh, with BIN set; root only (the caller checks). Gives
#   HOSTS, addr_of HOST, on PLACE HOST CMD..., serve PLACE NAME HOST PORT
#   ADVERTISE CMD..., wait_for_log NAME TEXT SECONDS, shaper_counters HOST,
#   set_link_rate RATE, rate_bytes RATE, SWITCH (the switch's namespace; its
#   port to host H is p-H), and LATENCY (netem, relay or none).

DELAY_MS=${DELAY_MS:-2}
RATE=${RATE:-1gbit}
TCP_CC=${TCP_CC:-}
TAG=grpsmh$$
NET=10.77.$((RANDOM % 250 + 2))
declare -p HOSTS >/dev/null 2>&1 || HOSTS=(coord s0 s1 w0 w1)  # host i: $NET.(i+1)
SWITCH=$TAG-sw
NAMESPACES=()

remove_namespaces() {
  local ns
  for ns in "${NAMESPACES[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
}
# lib.sh's cleanup first (it kills our processes by PID), then the namespaces.
trap 'cleanup; remove_namespaces' EXIT
trap 'exit 143' TERM HUP
trap 'exit 130' INT

addr_of() {  # addr_of HOST: the host's address
  local i
  for i in "${!HOSTS[@]}"; do
    [ "${HOSTS[$i]}" = "$1" ] && { echo "$NET.$((i + 1))"; return 0; }
  done
  return 1
}

new_namespace() {
  ip netns add "$1" 2>/dev/null || { echo "SKIP: cannot create a network namespace"; exit 77; }
  NAMESPACES+=("$1")
  ip -n "$1" link set lo up
}

# The hosts' names become interface names (p-HOST, 15 characters at most)
# and namespace names beside the switch's.
[ "${#HOSTS[@]}" -ge 1 ] && [ "${#HOSTS[@]}" -le 250 ] || fail "HOSTS: 1 to 250 hosts"
for h in "${HOSTS[@]}"; do
  [[ $h =~ ^[a-z0-9][a-z0-9_]{0,12}$ ]] && [ "$h" != sw ] ||
    fail "HOSTS: '$h' is not a host name (a-z 0-9 _, at most 13 characters, not sw)"
done
[ "$(printf '%s\n' "${HOSTS[@]}" | sort | uniq -d)" = "" ] || fail "HOSTS: a name twice"

# The switch first: the netem probe runs on its loopback link.
new_namespace "$SWITCH"
LATENCY=${GRPS_MH_LATENCY:-auto}
[ "$DELAY_MS" = 0 ] && LATENCY=none  # no delay to add: neither netem nor relays
if [ "$LATENCY" = auto ]; then
  if tc -n "$SWITCH" qdisc add dev lo root netem delay 1ms 2>/dev/null; then
    LATENCY=netem
    tc -n "$SWITCH" qdisc del dev lo root
  else
    LATENCY=relay
  fi
fi
case $LATENCY in
  netem | none) ;;
  relay) [ -x "$BIN/grps-delay-relay" ] || fail "no $BIN/grps-delay-relay (the kernel has no netem)" ;;
  *) fail "GRPS_MH_LATENCY=$LATENCY: netem, relay or none" ;;
esac
tcp_cc_said=$TCP_CC
[ -n "$TCP_CC" ] ||
  tcp_cc_said="$(ip netns exec "$SWITCH" cat /proc/sys/net/ipv4/tcp_congestion_control) (a new namespace's)"
echo "latency: $LATENCY ($DELAY_MS ms one way unless none); bandwidth: htb $RATE per host link, each direction; TCP: $tcp_cc_said; ${#HOSTS[@]} hosts"

ip -n "$SWITCH" link add br0 type bridge
ip -n "$SWITCH" link set br0 up
for h in "${HOSTS[@]}"; do
  ns=$TAG-$h
  new_namespace "$ns"
  # Both ends are made in the switch namespace and one moved at once: no
  # link ever exists in the root namespace.
  ip -n "$SWITCH" link add "p-$h" type veth peer name eth0 netns "$ns"
  ip -n "$SWITCH" link set "p-$h" master br0 up
  ip -n "$ns" addr add "$(addr_of "$h")/24" dev eth0
  ip -n "$ns" link set eth0 up
  if [ -n "$TCP_CC" ]; then
    ip netns exec "$ns" sysctl -qw net.ipv4.tcp_congestion_control="$TCP_CC" ||
      fail "TCP_CC=$TCP_CC: not a congestion control a namespace may use here (allowed: $(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control))"
  fi
  for end in "$ns eth0" "$SWITCH p-$h"; do
    read -r end_ns end_dev <<<"$end"
    tc -n "$end_ns" qdisc add dev "$end_dev" root handle 1: htb default 1
    tc -n "$end_ns" class add dev "$end_dev" parent 1: classid 1:1 htb rate "$RATE" \
      ceil "$RATE" burst 15kb cburst 15kb quantum 65536
  done
  if [ "$LATENCY" = netem ]; then
    tc -n "$ns" qdisc add dev eth0 parent 1:1 handle 10: netem delay "${DELAY_MS}ms" limit 10000
  fi
done
# Every host reaches every other through its veth (the routing table's word;
# no probe traffic).
for h in "${HOSTS[@]}"; do
  for peer in "${HOSTS[@]}"; do
    [ "$h" = "$peer" ] && continue
    route=$(ip -n "$TAG-$h" route get "$(addr_of "$peer")")
    grep -q " dev eth0 " <<<"$route" || fail "$h has no route to $peer over eth0: $route"
  done
done

# shaper_counters HOST: "bytes overlimits" of the htb on the host's egress
# (overlimits: how often it held a packet back for the rate).
shaper_counters() {
  tc -n "$TAG-$1" -s qdisc show dev eth0 | python3 -c '
import re, sys
text = sys.stdin.read()
m = re.search(r"qdisc htb .*?\n\s*Sent (\d+) bytes \d+ pkt \(dropped \d+, overlimits (\d+)", text, re.S)
print(m.group(1), m.group(2))'
}

# rate_bytes RATE: an htb rate (200mbit, 1gbit, ...) in bytes a second.
rate_bytes() {
  [[ $1 =~ ^([0-9]+)([kmg]?)bit$ ]] || fail "not an htb rate: $1"
  local unit=1
  case ${BASH_REMATCH[2]} in k) unit=1000 ;; m) unit=1000000 ;; g) unit=1000000000 ;; esac
  echo $((BASH_REMATCH[1] * unit / 8))
}

# set_link_rate RATE: every link's htb (both ends) at RATE from now on.
set_link_rate() {
  local h end end_ns end_dev
  for h in "${HOSTS[@]}"; do
    for end in "$TAG-$h eth0" "$SWITCH p-$h"; do
      read -r end_ns end_dev <<<"$end"
      tc -n "$end_ns" class change dev "$end_dev" parent 1: classid 1:1 htb rate "$1" \
        ceil "$1" burst 15kb cburst 15kb quantum 65536
    done
  done
  RATE=$1
}

# on PLACE HOST CMD...: runs CMD on HOST (in its namespace) when PLACE is
# hosts, else here. Execs, so that the PID start() records is the daemon's.
on() {
  local place=$1 host=$2; shift 2
  if [ "$place" = hosts ]; then exec ip netns exec "$TAG-$host" "$@"; else exec "$@"; fi
}

# wait_for_log NAME TEXT SECONDS: until $WORK/NAME.log contains TEXT.
wait_for_log() { wait_for_line "$WORK/$1.log" "$2" "$3"; }

# end_relays NAME...: in relay mode, ends the relays that serve started for
# the daemons NAME (which have exited), so that the next ones may listen on
# the same ports; nothing otherwise.
end_relays() {
  [ "$LATENCY" = relay ] || return 0
  local name pid_var
  for name in "$@"; do
    pid_var=PID_${name//-/_}_relay
    kill -TERM "${!pid_var}" 2>/dev/null || true
    wait_pid "${!pid_var}" 10
  done
}

# serve PLACE NAME HOST PORT ADVERTISE CMD...: starts a listening daemon CMD
# (which takes --listen and --port_file) on HOST and sets ADDRESS to the
# address the other hosts dial. Behind a relay on hosts in relay mode, when
# CMD is told the relay's address with the flag ADVERTISE ("-": none).
serve() {
  local place=$1 name=$2 host=$3 port=$4 advertise_flag=$5; shift 5
  local listen advertise=()
  if [ "$place" = loopback ]; then
    listen=127.0.0.1:0
  elif [ "$LATENCY" = relay ]; then
    listen=127.0.0.1:$port
    ADDRESS=$(addr_of "$host"):$port
    [ "$advertise_flag" = - ] || advertise=("$advertise_flag=$ADDRESS")
  else
    listen=$(addr_of "$host"):$port
  fi
  start "$name" on "$place" "$host" "$@" --listen="$listen" "${advertise[@]}" \
    --port_file="$WORK/$name.port"
  wait_for_file "$WORK/$name.port" 30
  if [ "$place" = loopback ]; then
    ADDRESS=127.0.0.1:$(cat "$WORK/$name.port")
  elif [ "$LATENCY" = relay ]; then
    start "$name-relay" on hosts "$host" "$BIN/grps-delay-relay" --listen="$ADDRESS" \
      --target="$listen" --delay_us=$((DELAY_MS * 1000))
    wait_for_log "$name-relay" "each way" 10
  else
    ADDRESS=$listen
  fi
}

