#!/usr/bin/env bash
# A 3-node Ray cluster on one machine, for tests (needs root):
#   scripts/cluster_netns.sh up     three network namespaces on a bridge, a Ray head in the first,
#                                   a worker in each of the others, token authentication on
#   scripts/cluster_netns.sh down   ends every process inside those namespaces (by PID: `ip netns
#                                   pids`), then removes namespaces, links and the state dir
#   scripts/cluster_netns.sh env    prints the variables a driver needs (eval "$(... env)")
# Addresses 10.77.0.1-3 exist only inside the namespaces; the bridge in the root namespace has
# no address and no route leads out, so nothing reaches any address outside this machine.
# Never `ray stop` (it ends every Ray process of the machine, other users' too), never kill by name.
# A driver runs inside the head's namespace:
#   ip netns exec roll-n0 env RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$STATE/token python ... ray_address=10.77.0.1:6379
set -euo pipefail

PREFIX=${ROLL_NETNS_PREFIX:-roll-n}
BRIDGE=${ROLL_NETNS_BRIDGE:-rollbr0}
SUBNET=${ROLL_NETNS_SUBNET:-10.77.0}
STATE=${ROLL_NETNS_STATE:-/tmp/rollc}     # short: Ray's unix socket paths live under it
NODE_CPUS=${ROLL_NETNS_CPUS:-1}           # CPUs each node declares to Ray
NODE_GPUS=${ROLL_NETNS_GPUS:-0}           # logical GPUs each node declares (none exist: for placement checks)
OBJECT_STORE=${ROLL_NETNS_OBJECT_STORE:-150000000}
PORT=6379
RAY_BIN=${RAY_BIN:-$(command -v ray)}

ns() { echo "${PREFIX}$1"; }
ip_of() { echo "${SUBNET}.$(($1 + 1))"; }

node_env() {  # the environment of every Ray process of the cluster and of its driver
  echo "RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$STATE/token RAY_TMPDIR=$STATE/tmp$1 RAY_USAGE_STATS_ENABLED=0"
}

up() {
  mkdir -p "$STATE"
  [ -s "$STATE/token" ] || { python -c "import secrets; print(secrets.token_hex(32))" > "$STATE/token"; chmod 600 "$STATE/token"; }
  ip link add "$BRIDGE" type bridge 2>/dev/null || true
  ip link set "$BRIDGE" up
  for i in 0 1 2; do
    local n; n=$(ns $i)
    ip netns add "$n"
    ip link add "vr$i" type veth peer name "vr${i}p"
    ip link set "vr${i}p" netns "$n"
    ip link set "vr$i" master "$BRIDGE" up
    ip -n "$n" addr add "$(ip_of $i)/24" dev "vr${i}p"
    ip -n "$n" link set "vr${i}p" up
    ip -n "$n" link set lo up
    mkdir -p "$STATE/tmp$i"
  done
  local head; head=$(ip_of 0)
  # shellcheck disable=SC2046
  ip netns exec "$(ns 0)" env $(node_env 0) "$RAY_BIN" start --head --node-ip-address="$head" --port=$PORT \
    --num-cpus="$NODE_CPUS" --num-gpus="$NODE_GPUS" --object-store-memory="$OBJECT_STORE" --include-dashboard=false \
    --temp-dir="$STATE/tmp0/ray" --disable-usage-stats > "$STATE/n0.log" 2>&1
  for i in 1 2; do
    # shellcheck disable=SC2046
    ip netns exec "$(ns $i)" env $(node_env $i) "$RAY_BIN" start --address="$head:$PORT" \
      --node-ip-address="$(ip_of $i)" --num-cpus="$NODE_CPUS" --num-gpus="$NODE_GPUS" --object-store-memory="$OBJECT_STORE" \
      --temp-dir="$STATE/tmp$i/ray" --disable-usage-stats > "$STATE/n$i.log" 2>&1
  done
  echo "cluster up: head $head:$PORT, workers $(ip_of 1) $(ip_of 2); token $STATE/token"
}

down() {
  for i in 0 1 2; do
    local n; n=$(ns $i)
    ip netns list | grep -qw "$n" || continue
    local pids; pids=$(ip netns pids "$n" | tr '\n' ' ')
    [ -n "$pids" ] && kill -TERM $pids 2>/dev/null || true
  done
  sleep 3
  for i in 0 1 2; do
    local n; n=$(ns $i)
    ip netns list | grep -qw "$n" || continue
    local pids; pids=$(ip netns pids "$n" | tr '\n' ' ')
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
    ip netns del "$n"
    ip link del "vr$i" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  rm -rf "$STATE"
  echo "cluster down"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  env) echo "export $(node_env 0)" ;;
  *) echo "usage: $0 up|down|env" >&2; exit 2 ;;
esac
