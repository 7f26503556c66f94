#!/usr/bin/env bash
# A real Kubernetes control plane on loopback for the tests: kube-apiserver, kube-controller-manager,
# kube-scheduler and etcd, built from the Go modules pinned in scripts/k8s/go.mod (k8s.io/kubernetes with its
# k8s.io/* staging modules replaced at the matching v0.x release, and go.etcd.io/etcd/server/v3 at the version
# Kubernetes itself requires). Sourced by scripts/lib.sh; also runnable:
#   bash scripts/k8s-cluster.sh build          # build (or reuse) the binaries, print their directory
#   bash scripts/k8s-cluster.sh up RUN_DIR     # build, start, print the admin kubeconfig; stop with `down`
#   bash scripts/k8s-cluster.sh down RUN_DIR   # stop what `up` started (by PID)
#   bash scripts/k8s-cluster.sh restart-apiserver RUN_DIR [SECONDS_DOWN] [TERM|KILL]
# Binaries and the Go build cache live under $QC_CACHE/k8s (about 3 GB of cache, ~10 minutes once on 2 cores).

QC_CACHE="${QC_CACHE:-$HOME/.cache/queue-consumer-operator}"
QC_K8S_MODULE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/k8s"
QC_K8S_VERSION=v1.37.2
QC_K8S_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler etcd)
# The address the API server binds to and advertises: loopback, or the node's (scripts/k8s-node.sh) so
# pods reach it.
QC_K8S_ADDRESS=${QC_K8S_ADDRESS:-127.0.0.1}

k8s_log() { printf '==> %s\n' "$*" >&2; }

# The binaries' directory, keyed by the module's go.mod and go.sum and this build recipe, so a change to
# any of them builds afresh and an unchanged one is reused.
k8s_bin_dir() {
  local key
  key=$(cat "$QC_K8S_MODULE_DIR/go.mod" "$QC_K8S_MODULE_DIR/go.sum" <(declare -f k8s_build) | sha256sum | cut -c1-16)
  printf '%s\n' "$QC_CACHE/k8s/control-plane-$key"
}

# Builds the four binaries, and the kubelet of scripts/k8s-node.sh, into k8s_bin_dir (once; a finished
# build leaves a .complete marker). Sets QC_K8S_BIN. Go from PATH: 1.26 is what TESTBED.md found fine (1.27 needs GOEXPERIMENT=nojsonv2 for OpenAPI).
k8s_build() {
  QC_K8S_BIN=$(k8s_bin_dir)
  [ -f "$QC_K8S_BIN/.complete" ] && return 0
  command -v go >/dev/null 2>&1 || { k8s_log "no go on PATH: cannot build the Kubernetes control plane"; return 1; }
  local gover; gover=$(go env GOVERSION)
  case "$gover" in
    go1.2[0-5]*) k8s_log "$gover is older than the go 1.26 that k8s.io/kubernetes $QC_K8S_VERSION needs"; return 1 ;;
    go1.2[6]*) ;;
    *) export GOEXPERIMENT="${GOEXPERIMENT:+$GOEXPERIMENT,}nojsonv2" ;;
  esac
  mkdir -p "$QC_K8S_BIN.tmp" "$QC_CACHE/k8s/gocache"
  local started=$SECONDS ver=${QC_K8S_VERSION#v}
  local vpkg=k8s.io/component-base/version
  local ldflags="-s -w -X $vpkg.gitVersion=$QC_K8S_VERSION -X $vpkg.gitMajor=${ver%%.*}"
  ldflags+=" -X $vpkg.gitMinor=$(cut -d. -f2 <<<"$ver") -X $vpkg.gitTreeState=clean"
  k8s_log "building ${QC_K8S_BINARIES[*]} ($QC_K8S_VERSION, $gover) into $QC_K8S_BIN (about 10 minutes on 2 cores, once)"
  # etcd's main package is the root of its server module: named explicitly, as go would call it "server".
  if ! (cd "$QC_K8S_MODULE_DIR" && export GOCACHE="$QC_CACHE/k8s/gocache" GOFLAGS=-mod=readonly CGO_ENABLED=0 &&
    go build -trimpath -ldflags "$ldflags" -o "$QC_K8S_BIN.tmp/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet &&
    go build -trimpath -ldflags "-s -w" -o "$QC_K8S_BIN.tmp/etcd" go.etcd.io/etcd/server/v3) \
    >"$QC_CACHE/k8s/build.log" 2>&1; then
    tail -20 "$QC_CACHE/k8s/build.log" >&2
    k8s_log "building the Kubernetes control plane failed: see $QC_CACHE/k8s/build.log"
    return 1
  fi
  local b
  for b in "${QC_K8S_BINARIES[@]}" kubelet; do
    [ -x "$QC_K8S_BIN.tmp/$b" ] || { k8s_log "the build made no $b"; return 1; }
  done
  rm -rf "$QC_K8S_BIN" && mv "$QC_K8S_BIN.tmp" "$QC_K8S_BIN" && touch "$QC_K8S_BIN/.complete"
  k8s_log "built the control plane in $((SECONDS - started)) s"
}

# A private key and a certificate signed by CA (or self-signed when CA is "-"), X.509 v3 with the
# extensions rustls insists on. k8s_cert DIR NAME SUBJECT CA EXT
k8s_cert() {
  local dir=$1 name=$2 subject=$3 ca=$4 ext=$5
  printf '%s\n' "$ext" >"$dir/$name.ext"
  if [ "$ca" = - ]; then
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$dir/$name.key" -out "$dir/$name.crt" -days 30 \
      -subj "$subject" -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
      2>/dev/null
  else
    openssl req -newkey rsa:2048 -nodes -keyout "$dir/$name.key" -out "$dir/$name.csr" -subj "$subject" 2>/dev/null &&
      openssl x509 -req -in "$dir/$name.csr" -CA "$dir/$ca.crt" -CAkey "$dir/$ca.key" -CAcreateserial \
        -out "$dir/$name.crt" -days 30 -extfile "$dir/$name.ext" 2>/dev/null
  fi
}

# k8s_kubeconfig FILE SERVER CA CERT KEY
k8s_kubeconfig() {
  cat >"$1" <<KC
apiVersion: v1
kind: Config
clusters: [{name: qc-test, cluster: {server: "$2", certificate-authority: "$3"}}]
users: [{name: user, user: {client-certificate: "$4", client-key: "$5"}}]
contexts: [{name: qc-test, context: {cluster: qc-test, user: user}}]
current-context: qc-test
KC
}

k8s_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# Whether every process `up` started in RUN is alive.
k8s_alive() {
  local run=$1 b pid
  for b in "${QC_K8S_BINARIES[@]}"; do
    pid=$(cat "$run/$b.pid" 2>/dev/null) || return 1
    kill -0 "$pid" 2>/dev/null || return 1
  done
}

# Starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler on loopback, with their state,
# certificates, logs and PIDs in RUN (created). Writes RUN/kubeconfig (cluster admin: group
# system:masters, by client certificate) and sets QC_K8S_KUBECONFIG. When RUN already holds a running
# control plane that answers /readyz, reuses it. Returns 1, with the logs' tails, if it cannot start.
k8s_up() {
  local run=$1
  k8s_build || return 1
  mkdir -p "$run"
  run=$(cd "$run" && pwd)
  QC_K8S_KUBECONFIG=$run/kubeconfig
  if k8s_alive "$run" && [ -f "$run/kubeconfig" ] && k8s_ready "$run" 1; then
    k8s_log "control plane in $run is running already"
    return 0
  fi
  k8s_down "$run"
  local started=$SECONDS pki=$run/pki
  rm -rf "$run/etcd-data" "$pki" && mkdir -p "$pki"
  local api etcd_client etcd_peer cm sched
  api=$(k8s_free_port) etcd_client=$(k8s_free_port) etcd_peer=$(k8s_free_port) cm=$(k8s_free_port) sched=$(k8s_free_port)
  local addr=$QC_K8S_ADDRESS
  local server=https://$addr:$api client_ext
  client_ext=$(printf '%s\n' 'basicConstraints=CA:FALSE' 'keyUsage=critical,digitalSignature,keyEncipherment' 'extendedKeyUsage=clientAuth')
  {
    k8s_cert "$pki" ca "/CN=qc-test-ca" - "" &&
      k8s_cert "$pki" front-proxy-ca "/CN=qc-test-front-proxy-ca" - "" &&
      k8s_cert "$pki" apiserver "/CN=kube-apiserver" ca "$(printf '%s\n' \
        'basicConstraints=CA:FALSE' 'keyUsage=critical,digitalSignature,keyEncipherment' 'extendedKeyUsage=serverAuth' \
        "subjectAltName=IP:127.0.0.1,IP:$addr,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local")" &&
      k8s_cert "$pki" admin "/O=system:masters/CN=qc-admin" ca "$client_ext" &&
      k8s_cert "$pki" apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" ca "$client_ext" &&
      k8s_cert "$pki" controller-manager "/CN=system:kube-controller-manager" ca "$client_ext" &&
      k8s_cert "$pki" scheduler "/CN=system:kube-scheduler" ca "$client_ext" &&
      k8s_cert "$pki" front-proxy-client "/CN=front-proxy-client" front-proxy-ca "$client_ext" &&
      openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null &&
      openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  } || { k8s_log "cannot make the control plane's certificates in $pki"; return 1; }
  k8s_kubeconfig "$run/kubeconfig" "$server" "$pki/ca.crt" "$pki/admin.crt" "$pki/admin.key"
  k8s_kubeconfig "$run/controller-manager.kubeconfig" "$server" "$pki/ca.crt" "$pki/controller-manager.crt" "$pki/controller-manager.key"
  k8s_kubeconfig "$run/scheduler.kubeconfig" "$server" "$pki/ca.crt" "$pki/scheduler.crt" "$pki/scheduler.key"
  # Every request's metadata (user, user agent, verb, object, request URI with its fieldManager) in
  # RUN/audit.log, one JSON line each: tests read what the operator really sent. Writes of QueueConsumers
  # and Deployments (subresources too) also carry the object sent and the object stored: the response's
  # resourceVersion tells a write that changed something from one the server found unchanged (a no-op keeps
  # the resourceVersion), which is how tests/k8s_failover.rs counts duplicate writes. QC_K8S_AUDIT_OBJECTS=0:
  # metadata only (scripts/bench-cluster: thousands of objects, whose bodies would cost the API server).
  cat >"$run/audit-policy.yaml" <<'POLICY'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: RequestResponse
    verbs: [create, update, patch]
    resources:
      - {group: sqs.consumers.dev, resources: [queueconsumers, queueconsumers/status]}
      - {group: apps, resources: [deployments, deployments/status]}
  - level: Metadata
POLICY
  if [ "${QC_K8S_AUDIT_OBJECTS:-1}" = 0 ]; then
    printf '%s\n' 'apiVersion: audit.k8s.io/v1' 'kind: Policy' 'omitStages: [RequestReceived]' \
      'rules: [{level: Metadata}]' >"$run/audit-policy.yaml"
  fi
  local bin=$QC_K8S_BIN
  # Each process in a session of its own (setsid), so a terminal's Ctrl-C reaches the caller, which stops
  # them by PID; --unsafe-no-fsync: the data is thrown away with RUN.
  setsid "$bin/etcd" --name qc-test --data-dir "$run/etcd-data" --log-level warn --unsafe-no-fsync \
    --listen-client-urls "http://127.0.0.1:$etcd_client" --advertise-client-urls "http://127.0.0.1:$etcd_client" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "qc-test=http://127.0.0.1:$etcd_peer" --listen-metrics-urls "" \
    >"$run/etcd.log" 2>&1 &
  echo $! >"$run/etcd.pid"
  # The Node authorizer and RBAC; the default admission plugins (PodSecurity among them) plus
  # OwnerReferencesPermissionEnforcement and NodeRestriction (for the kubelet of scripts/k8s-node.sh, which
  # the API server reaches with a client certificate of its own for logs and exec);
  # service-account tokens (TokenRequest); a loopback advertise address, which the endpoint reconciler
  # refuses, hence none; front-proxy flags, without which the controller-manager and scheduler log
  # CA-bundle errors several times a second.
  # Its arguments are kept in RUN/kube-apiserver.args (one a line), so `k8s_restart_apiserver` starts it
  # again as it was.
  printf '%s\n' --etcd-servers "http://127.0.0.1:$etcd_client" \
    --bind-address "$addr" --advertise-address "$addr" --secure-port "$api" --endpoint-reconciler-type none \
    --authorization-mode Node,RBAC --enable-admission-plugins OwnerReferencesPermissionEnforcement,NodeRestriction \
    --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP \
    --client-ca-file "$pki/ca.crt" --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-cluster-ip-range 10.96.0.0/16 \
    --requestheader-client-ca-file "$pki/front-proxy-ca.crt" --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file "$pki/front-proxy-client.crt" --proxy-client-key-file "$pki/front-proxy-client.key" \
    --audit-policy-file "$run/audit-policy.yaml" --audit-log-path "$run/audit.log" --audit-log-format json \
    --audit-log-maxsize 500 --audit-log-maxbackup 1 >"$run/kube-apiserver.args"
  k8s_start_apiserver "$run"
  # The controller-manager and scheduler once the API server serves (with its RBAC bootstrap policy):
  # started earlier, the controller-manager is refused its own configuration and exits.
  if ! k8s_wait "$run" 60 /readyz etcd kube-apiserver; then
    k8s_fail "$run" "the API server did not become ready within 60 s"
    return 1
  fi
  # Every controller (Deployments -> ReplicaSets -> Pods, namespace finalization, garbage collection, the
  # service-account token and root CA publishers), each under its own service account as in a cluster.
  setsid "$bin/kube-controller-manager" --kubeconfig "$run/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$run/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$run/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$cm" --leader-elect=false --controllers '*' \
    --use-service-account-credentials --service-account-private-key-file "$pki/sa.key" \
    --root-ca-file "$pki/ca.crt" --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
    >"$run/kube-controller-manager.log" 2>&1 &
  echo $! >"$run/kube-controller-manager.pid"
  setsid "$bin/kube-scheduler" --kubeconfig "$run/scheduler.kubeconfig" \
    --authentication-kubeconfig "$run/scheduler.kubeconfig" --authorization-kubeconfig "$run/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$sched" --leader-elect=false \
    >"$run/kube-scheduler.log" 2>&1 &
  echo $! >"$run/kube-scheduler.pid"
  # Ready for work once the controller-manager's service-account controller made kube-system/default
  # (the controllers' own tokens come from the same machinery).
  if ! k8s_wait "$run" 60 /api/v1/namespaces/kube-system/serviceaccounts/default "${QC_K8S_BINARIES[@]}"; then
    k8s_fail "$run" "the controller-manager did not start its controllers within 60 s"
    return 1
  fi
  k8s_log "Kubernetes $QC_K8S_VERSION control plane on $server ready in $((SECONDS - started)) s (state and logs in $run)"
}

# Starts kube-apiserver with the arguments `k8s_up` kept in RUN (its log appended to), and writes its PID.
k8s_start_apiserver() {
  local run=$1 args
  mapfile -t args <"$run/kube-apiserver.args"
  setsid "$QC_K8S_BIN/kube-apiserver" "${args[@]}" >>"$run/kube-apiserver.log" 2>&1 &
  echo $! >"$run/kube-apiserver.pid"
}

# Stops RUN's kube-apiserver (SIGNAL: TERM, a graceful stop, or KILL), keeps it down for SECONDS, starts it
# again with the same arguments (same port, certificates and etcd: the state survives) and waits for
# /readyz. For tests of what a client sees across an API server restart (tests/k8s_failover.rs).
# k8s_restart_apiserver RUN SECONDS [SIGNAL]
k8s_restart_apiserver() {
  local run=$1 down=$2 signal=${3:-TERM} pid
  k8s_build || return 1
  pid=$(cat "$run/kube-apiserver.pid") || return 1
  kill "-$signal" "$pid" 2>/dev/null || { k8s_log "kube-apiserver ($pid) is not running"; return 1; }
  for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && { kill -9 "$pid" 2>/dev/null; sleep 0.2; }
  sleep "$down"
  k8s_start_apiserver "$run"
  k8s_wait "$run" 120 /readyz etcd kube-apiserver || { k8s_log "kube-apiserver did not come back"; return 1; }
}

# Whether RUN's API server answers PATH (as cluster admin) within SECONDS, while the processes named
# after them are alive. k8s_wait RUN SECONDS PATH PROCESS...
k8s_wait() {
  local run=$1 deadline=$((SECONDS + $2)) path=$3 server b pid
  shift 3
  server=$(sed -n 's/.*server: "\([^"]*\)".*/\1/p' "$run/kubeconfig")
  until curl -fsS -o /dev/null --cacert "$run/pki/ca.crt" --cert "$run/pki/admin.crt" --key "$run/pki/admin.key" \
    "$server$path" 2>/dev/null; do
    [ "$SECONDS" -ge "$deadline" ] && return 1
    for b in "$@"; do
      pid=$(cat "$run/$b.pid" 2>/dev/null) || return 1
      kill -0 "$pid" 2>/dev/null || { k8s_log "$b exited"; return 1; }
    done
    sleep 0.2
  done
}

# Whether the control plane in RUN runs and serves.
k8s_ready() {
  k8s_alive "$1" && k8s_wait "$1" "$2" /readyz "${QC_K8S_BINARIES[@]}"
}

# The logs' last lines, the message, and everything stopped.
k8s_fail() {
  local run=$1 b
  for b in "${QC_K8S_BINARIES[@]}"; do
    [ -f "$run/$b.log" ] || continue
    k8s_log "$run/$b.log (last lines):"; tail -5 "$run/$b.log" >&2
  done
  k8s_down "$run"
  k8s_log "$2"
}

# Resident memory of what `up` started in RUN, in MiB.
k8s_rss_mib() {
  local run=$1 b pid kib=0 rss
  for b in "${QC_K8S_BINARIES[@]}"; do
    pid=$(cat "$run/$b.pid" 2>/dev/null) || continue
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null) || continue
    kib=$((kib + ${rss:-0}))
  done
  echo $((kib / 1024))
}

# Stops what `up` started in RUN, by the PIDs it wrote (SIGTERM, then SIGKILL after 10 s).
k8s_down() {
  local run=$1 b pid
  for b in kube-scheduler kube-controller-manager kube-apiserver etcd; do
    pid=$(cat "$run/$b.pid" 2>/dev/null) || continue
    if kill "$pid" 2>/dev/null; then
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$run/$b.pid"
  done
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  case "${1:-}" in
    build) k8s_build && printf '%s\n' "$QC_K8S_BIN" ;;
    up) k8s_up "${2:?RUN_DIR}" && k8s_log "resident $(k8s_rss_mib "$2") MiB" && printf '%s\n' "$QC_K8S_KUBECONFIG" ;;
    down) k8s_down "${2:?RUN_DIR}" ;;
    restart-apiserver) k8s_restart_apiserver "${2:?RUN_DIR}" "${3:-0}" "${4:-TERM}" ;;
    *) echo "usage: $0 build | up RUN_DIR | down RUN_DIR | restart-apiserver RUN_DIR [SECONDS_DOWN] [TERM|KILL]" >&2; exit 2 ;;
  esac
fi
