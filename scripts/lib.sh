# Shared setup for scripts/test and scripts/demo: tools in a cache outside the clone, services on loopback.
# Sourced, not run. Every step is idempotent.

QC_CACHE="${QC_CACHE:-$HOME/.cache/queue-consumer-operator}"
QC_VENV="$QC_CACHE/venv"
mkdir -p "$QC_CACHE"

log() { printf '==> %s\n' "$*" >&2; }

# A Python venv with moto's server and kubernetes-validate.
ensure_venv() {
  if [ ! -x "$QC_VENV/bin/moto_server" ] || [ ! -x "$QC_VENV/bin/kubernetes-validate" ]; then
    log "installing moto[server] and kubernetes-validate into $QC_VENV"
    python3 -m venv "$QC_VENV"
    "$QC_VENV/bin/pip" install --quiet --disable-pip-version-check 'moto[server]>=5.1' 'kubernetes-validate>=1.31'
  fi
}

# Debian's redis-server.
ensure_redis() {
  if ! command -v redis-server >/dev/null 2>&1; then
    log "installing redis-server"
    if [ ! -f "$QC_CACHE/apt-updated" ]; then apt-get update -qq && touch "$QC_CACHE/apt-updated"; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  fi
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

QC_PIDS=()
stop_services() {
  for pid in "${QC_PIDS[@]:-}"; do
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  done
  QC_PIDS=()
}

wait_http() { # url, seconds
  local url=$1 deadline=$(( $(date +%s) + $2 ))
  until curl -fsS -o /dev/null "$url" 2>/dev/null; do
    [ "$(date +%s)" -ge "$deadline" ] && { log "timed out waiting for $url"; return 1; }
    sleep 0.1
  done
}

# moto on a free loopback port; exports QC_TEST_SQS_ENDPOINT and AWS_* for the SDK.
start_moto() {
  local port; port=$(free_port)
  "$QC_VENV/bin/moto_server" -H 127.0.0.1 -p "$port" >"$QC_CACHE/moto.log" 2>&1 &
  QC_PIDS+=($!)
  wait_http "http://127.0.0.1:$port/moto-api/" 30
  export QC_TEST_SQS_ENDPOINT="http://127.0.0.1:$port"
  export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1
  unset AWS_SESSION_TOKEN AWS_PROFILE
  log "moto on $QC_TEST_SQS_ENDPOINT"
}

start_redis() {
  local port; port=$(free_port)
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no >"$QC_CACHE/redis.log" 2>&1 &
  QC_PIDS+=($!)
  local deadline=$(( $(date +%s) + 20 ))
  until redis-cli -p "$port" ping >/dev/null 2>&1; do
    [ "$(date +%s)" -ge "$deadline" ] && { log "redis did not start"; return 1; }
    sleep 0.1
  done
  export QC_TEST_REDIS_URL="redis://127.0.0.1:$port"
  log "redis on $QC_TEST_REDIS_URL"
}
