#!/usr/bin/env bash
# bigroom.sh: one room of N members over as many ChatLink processes as they need, on this
# machine, from one command (docs/scale.md, docs/benchmarks.md).
#
# It starts a nats-server with JetStream, one `roomcast services` process (room service,
# presence, dispatcher, server API), and ceil(N / PER_CHATLINK_PLAN) ChatLink processes, each
# taking at most PER_CHATLINK connections; then `roomcast bench fanout` logs the N members in
# through the dispatcher at LOGIN_RATE a second (its worker processes hold PER_PROCESS members
# each), broadcasts RATE messages a second for DURATION, and reports deliveries, losses and the
# latency from publish to receipt. Last it prints each tier's RSS (NATS, services, ChatLinks)
# with members connected, less the tier's RSS before the logins, per member.
#
# Settings (environment):
#   N=250000 RATE=1 DURATION=60s LOGIN_RATE=1000 PER_CHATLINK=19700 PER_CHATLINK_PLAN=18000
#   PER_PROCESS=18000 TICK=0 (the room's flush tick; 0: the server's) WORK=<temp dir>
#   ROOMCAST=<binary> NATS_SERVER=<binary> (both built from this checkout when unset)
#   BASE_PORT=21000 (uses BASE_PORT..BASE_PORT+400) BENCH_ARGS="" (more `bench fanout` flags)
#   CHATLINK_ARGS="" SERVICES_ARGS="" (more flags of each ChatLink, of the services)
#   BENCH_NICE=10 (the load generator's niceness: on one machine the tiers under test keep
#   the CPU they need, and a bench that falls behind shows in its own figures)
#
# The open-file limit bounds a process's sockets (20,000 on the machine measured): keep
# PER_CHATLINK and PER_PROCESS under it. Output: the bench's summary, its JSON on the line
# starting with '{', and a line starting with "tiers " with the per-member RSS figures.
set -euo pipefail
# shellcheck disable=SC2086 # BENCH_ARGS, CHATLINK_ARGS and SERVICES_ARGS are lists of flags

N=${N:-250000}
RATE=${RATE:-1}
DURATION=${DURATION:-60s}
LOGIN_RATE=${LOGIN_RATE:-1000}
PER_CHATLINK=${PER_CHATLINK:-19700}
PER_CHATLINK_PLAN=${PER_CHATLINK_PLAN:-18000}
PER_PROCESS=${PER_PROCESS:-18000}
TICK=${TICK:-0}
BASE_PORT=${BASE_PORT:-21000}
BENCH_ARGS=${BENCH_ARGS:-}
CHATLINK_ARGS=${CHATLINK_ARGS:-}
SERVICES_ARGS=${SERVICES_ARGS:-}
BENCH_NICE=${BENCH_NICE:-10}
CHATLINKS=$(((N + PER_CHATLINK_PLAN - 1) / PER_CHATLINK_PLAN))
WORK=${WORK:-$(mktemp -d -t roomcast-bigroom.XXXXXX)}
mkdir -p "$WORK"
repo=$(cd "$(dirname "$0")/.." && pwd)

if [[ -z ${ROOMCAST:-} ]]; then
	ROOMCAST=$WORK/roomcast
	(cd "$repo" && go build -o "$ROOMCAST" ./cmd/roomcast)
fi
if [[ -z ${NATS_SERVER:-} ]]; then
	NATS_SERVER=$WORK/nats-server
	(cd "$repo" && go build -o "$NATS_SERVER" github.com/nats-io/nats-server/v2)
fi

pids=()
# cleanup stops the processes in the reverse order of their start (NATS last, so the others
# shut down against it), and kills what has not ended within 10 s.
cleanup() {
	local i pid
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[i]}" 2>/dev/null || true; done
	for _ in $(seq 100); do
		alive=0
		for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
		((alive)) || break
		sleep 0.1
	done
	for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
	wait 2>/dev/null || true
}
trap cleanup EXIT

# ready waits up to 60 s for an ops endpoint's /readyz.
ready() {
	for _ in $(seq 600); do
		curl -sf -o /dev/null "http://$1/readyz" && return 0
		sleep 0.1
	done
	echo "bigroom: $2 at $1 not ready (log: $WORK/$2.log)" >&2
	return 1
}

rss() { awk '/^VmRSS:/ {print $2 * 1024}' "/proc/$1/status"; }

nats_port=$BASE_PORT
"$NATS_SERVER" -a 127.0.0.1 -p "$nats_port" -js -sd "$WORK/jetstream" >"$WORK/nats.log" 2>&1 &
nats_pid=$!
pids+=("$nats_pid")
nats_url=nats://127.0.0.1:$nats_port
for _ in $(seq 100); do
	(exec 3<>"/dev/tcp/127.0.0.1/$nats_port") 2>/dev/null && break
	sleep 0.1
done

secret=roomcast-dev-secret
key=roomcast-dev-key
api=127.0.0.1:$((BASE_PORT + 1))
"$ROOMCAST" services --nats "$nats_url" --api-key "$key=demo" --listen "$api" \
	--grpc-listen "127.0.0.1:$((BASE_PORT + 2))" --ops "127.0.0.1:$((BASE_PORT + 3))" $SERVICES_ARGS >"$WORK/services.log" 2>&1 &
services_pid=$!
pids+=("$services_pid")
ready "127.0.0.1:$((BASE_PORT + 3))" services

chatlink_pids=()
for i in $(seq "$CHATLINKS"); do
	ops=127.0.0.1:$((BASE_PORT + 300 + i))
	"$ROOMCAST" chatlink --nats "$nats_url" --node "edge-$i" --secret "demo=$secret" \
		--ws "127.0.0.1:$((BASE_PORT + 100 + i))" --tcp "127.0.0.1:$((BASE_PORT + 200 + i))" --ops "$ops" \
		--max-connections "$PER_CHATLINK" $CHATLINK_ARGS >"$WORK/chatlink-$i.log" 2>&1 &
	chatlink_pids+=($!)
	pids+=($!)
done
for i in $(seq "$CHATLINKS"); do ready "127.0.0.1:$((BASE_PORT + 300 + i))" "chatlink-$i"; done
# The dispatcher hears of every ChatLink within a report interval.
sleep 2

before_nats=$(rss "$nats_pid")
before_services=$(rss "$services_pid")
before_chatlinks=0
for pid in "${chatlink_pids[@]}"; do before_chatlinks=$((before_chatlinks + $(rss "$pid"))); done

pid_list=$nats_pid,$services_pid$(printf ',%s' "${chatlink_pids[@]}")
echo "bigroom: N=$N over $CHATLINKS ChatLinks (at most $PER_CHATLINK each), logins $LOGIN_RATE/s, $RATE msg/s for $DURATION, bench at nice $BENCH_NICE; load: $(cut -d' ' -f1-3 /proc/loadavg); work dir $WORK" >&2
status=0
nice -n "$BENCH_NICE" "$ROOMCAST" bench fanout --dispatcher "http://$api" --api-key "$key" --secret "$secret" \
	--n "$N" --rate "$RATE" --duration "$DURATION" --tick "${TICK}" --client raw \
	--per-process "$PER_PROCESS" --login-rate "$LOGIN_RATE" --pid "$pid_list" --json $BENCH_ARGS \
	>"$WORK/bench.out" || status=$?
cat "$WORK/bench.out"
echo "bigroom: load after the run: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

json=$(grep '^{' "$WORK/bench.out" | tail -1)
if [[ -n $json ]]; then
	jq -r --argjson bn "$before_nats" --argjson bs "$before_services" --argjson bc "$before_chatlinks" '
		.server_processes as $p | (.connected // 0) as $c | (if $c > 0 then $c else 1 end) as $m |
		([$p[2:][].rss_bytes] | add) as $cl |
		"tiers members=\($c) chatlinks=\($p | length - 2)" +
		" nats_rss_per_member=\((($p[0].rss_bytes - $bn) / $m) | floor)B" +
		" services_rss_per_member=\((($p[1].rss_bytes - $bs) / $m) | floor)B" +
		" chatlinks_rss_per_member=\((($cl - $bc) / $m) | floor)B" +
		" total_rss_per_member=\((($p[0].rss_bytes - $bn + $p[1].rss_bytes - $bs + $cl - $bc) / $m) | floor)B" +
		" nats_rss=\($p[0].rss_bytes) services_rss=\($p[1].rss_bytes) chatlinks_rss=\($cl)"' <<<"$json"
fi
exit "$status"
