#!/usr/bin/env bash
# A real node for the control plane of scripts/k8s-cluster.sh: the kubelet (built from the same
# k8s.io/kubernetes modules), Debian's containerd 1.6 and runc 1.1, and a pod network of CNI `bridge` +
# `host-local` (Debian's containernetworking-plugins) on a private subnet. Sourced by scripts/lib.sh; also
# runnable:
#   bash scripts/k8s-node.sh network-up            # the node's address (before the control plane starts)
#   bash scripts/k8s-node.sh up RUN_DIR            # containerd + kubelet for the control plane in RUN_DIR
#   bash scripts/k8s-node.sh import RUN_DIR IMAGE...   # podman images into the node's containerd
#   bash scripts/k8s-node.sh down RUN_DIR          # stops the node and undoes every host change
#
# What it changes on the host, all undone by `down` (and by `network-down` for the address), each named so
# nothing else is touched:
#   - a veth pair $QC_NODE_IFACE (and -peer) holding the node's address $QC_NODE_IP (a loopback node IP is refused
#     for Node status; the control plane binds to this address so pods reach it);
#   - the pods' bridge $QC_POD_BRIDGE and the network namespaces containerd makes for pods (cni-*);
#   - net.ipv4.ip_forward, which the bridge plugin turns on for a gateway: restored to what it was;
#   - an iptables chain QC-NODE-EGRESS in FORWARD that drops anything from the pod subnet not bound for the
#     bridge: no traffic from a pod can leave the machine (the pods' routes name only the node's address
#     anyway, and containerd runs with a proxy that refuses every image pull);
#   - cgroups under /$QC_NODE_CGROUP_ROOT in each hierarchy (the kubelet's cgroupRoot);
#   - symlinks in /var/log/containers that point into RUN_DIR (the kubelet's fixed container-log directory).
# Everything else (containerd's root and state, the kubelet's root, pod logs, IPAM state, CNI config) lives
# in RUN_DIR/node. Processes are stopped by the PIDs written there.

QC_CACHE="${QC_CACHE:-$HOME/.cache/queue-consumer-operator}"
QC_NODE_NAME=${QC_NODE_NAME:-qc-node}
QC_NODE_IP=${QC_NODE_IP:-10.212.0.1}
QC_NODE_IFACE=${QC_NODE_IFACE:-qc-node0}
QC_POD_SUBNET_PREFIX=${QC_POD_SUBNET_PREFIX:-10.213.0}
QC_POD_BRIDGE=${QC_POD_BRIDGE:-qc-br0}
QC_NODE_CGROUP_ROOT=${QC_NODE_CGROUP_ROOT:-qc-node}
# The pause image containerd runs as each pod's sandbox: built here from the kubernetes source tree's
# pause.c (no registry is reachable), under the name containerd 1.6 asks for.
QC_PAUSE_IMAGE=registry.k8s.io/pause:3.10
# Pods schedule on the node only when they tolerate this taint: the other tests' Deployments (whose images
# exist nowhere) stay Pending, as they did before there was a node.
QC_NODE_TAINT_KEY=qc.test/node
QC_NODE_FIXED_DIRS="/run/containerd/s /run/containerd/runc /run/containerd /var/lib/cni/results /var/lib/cni /var/log/containers /var/log/pods"

k8s_node_log() { printf '==> %s\n' "$*" >&2; }

# Whether this machine can run the node: root, and the tools (containerd, runc, CNI plugins, ip, iptables)
# installed from the distribution when missing. Returns 1 with the reason on stderr.
k8s_node_ensure() {
  [ "$(id -u)" -eq 0 ] || { k8s_node_log "the node needs root (containerd, runc, network namespaces, cgroups)"; return 1; }
  local missing=()
  command -v containerd >/dev/null 2>&1 || missing+=(containerd)
  command -v runc >/dev/null 2>&1 || missing+=(runc)
  [ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
  command -v iptables >/dev/null 2>&1 || missing+=(iptables)
  command -v ip >/dev/null 2>&1 || missing+=(iproute2)
  if [ "${#missing[@]}" -gt 0 ]; then
    k8s_node_log "installing ${missing[*]} (apt)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
      >"$QC_CACHE/apt-node.log" 2>&1 || { tail -5 "$QC_CACHE/apt-node.log" >&2; k8s_node_log "cannot install ${missing[*]}"; return 1; }
  fi
}

# The kubelet and the pause binary, built once into the control plane's cache (k8s_build builds the kubelet
# with the control plane; pause.c comes from the same k8s.io/kubernetes module).
k8s_node_build() {
  k8s_build || return 1
  [ -x "$QC_K8S_BIN/kubelet" ] || { k8s_node_log "no kubelet in $QC_K8S_BIN"; return 1; }
  [ -x "$QC_K8S_BIN/pause" ] && return 0
  local src cc
  src=$(cd "$QC_K8S_MODULE_DIR" && GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
  [ -f "$src" ] || { k8s_node_log "no pause.c at $src"; return 1; }
  cc=$(command -v musl-gcc || command -v gcc) || { k8s_node_log "no C compiler for pause.c"; return 1; }
  if ! { "$cc" -Os -static -DVERSION=v3.10-qc -o "$QC_K8S_BIN/pause.tmp" "$src" && strip "$QC_K8S_BIN/pause.tmp" &&
    mv "$QC_K8S_BIN/pause.tmp" "$QC_K8S_BIN/pause"; }; then
    k8s_node_log "cannot build pause from $src"; return 1
  fi
}

# The node's address on an interface of its own (idempotent). Run before the control plane starts: it binds there.
k8s_node_network_up() {
  # A veth pair (this kernel has no dummy driver), both ends up so the address has a carrier; the peer holds
  # nothing.
  if ! ip link show "$QC_NODE_IFACE" >/dev/null 2>&1; then
    ip link add "$QC_NODE_IFACE" type veth peer name "$QC_NODE_IFACE-peer" || return 1
  fi
  ip addr replace "$QC_NODE_IP/32" dev "$QC_NODE_IFACE" && ip link set "$QC_NODE_IFACE-peer" up &&
    ip link set "$QC_NODE_IFACE" up
}

k8s_node_network_down() {
  ip link del "$QC_NODE_IFACE" 2>/dev/null || true
}

k8s_node_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# Starts containerd and the kubelet for the control plane in RUN (k8s_up's directory: its pki and admin
# kubeconfig), waits for the Node to be Ready, and imports the pause image. Sets QC_NODE_CONTAINERD (the
# socket). Returns 1, with the logs' tails, when the node does not come up.
k8s_node_up() {
  local run=$1
  run=$(cd "$run" && pwd)
  k8s_node_ensure || return 1
  k8s_node_build || return 1
  k8s_node_network_up || { k8s_node_log "cannot add the node's address $QC_NODE_IP on $QC_NODE_IFACE"; return 1; }
  local node=$run/node pki=$run/pki started=$SECONDS
  # One node per machine: its names and subnet are fixed. Another run's node (or one a killed run left)
  # would share the bridge and the pods' addresses.
  if [ ! -f "$node/kubelet.pid" ] && { ip link show "$QC_POD_BRIDGE" >/dev/null 2>&1 ||
    iptables -w -S QC-NODE-EGRESS >/dev/null 2>&1; }; then
    k8s_node_log "another node is up on this machine ($QC_POD_BRIDGE or the QC-NODE-EGRESS chain exists): stop it"
    k8s_node_log "first (bash scripts/k8s-node.sh down ITS_RUN_DIR), or remove them if its run was killed"
    return 1
  fi
  mkdir -p "$node"/{containerd,cni/net.d,cni/ipam,kubelet,pod-logs}
  QC_NODE_CONTAINERD=$node/containerd/containerd.sock
  cat /proc/sys/net/ipv4/ip_forward >"$node/ip_forward.before"
  # Directories containerd 1.6 and libcni make at fixed paths (shim sockets, CNI's result cache): removed
  # by `down` when empty, unless they were here before.
  local d
  for d in $QC_NODE_FIXED_DIRS; do [ -e "$d" ] || echo "$d"; done >"$node/fixed-dirs.made"

  cat >"$node/containerd.toml" <<TOML
version = 2
root = "$node/containerd/root"
state = "$node/containerd/state"
[grpc]
  address = "$QC_NODE_CONTAINERD"
[ttrpc]
  address = "$QC_NODE_CONTAINERD.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$QC_PAUSE_IMAGE"
  # runc may not lower oom_score_adj on this VM (nsexec: Permission denied).
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$node/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      Root = "$node/runc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$node/containerd/opt"
TOML
  # A gateway on the bridge; the only route a pod gets is to the node's address (the API server, moto):
  # no default route, no masquerade.
  cat >"$node/cni/net.d/10-qc-pods.conflist" <<JSON
{"cniVersion": "0.4.0", "name": "qc-pods", "plugins": [
  {"type": "bridge", "bridge": "$QC_POD_BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$node/cni/ipam",
            "ranges": [[{"subnet": "$QC_POD_SUBNET_PREFIX.0/24", "gateway": "$QC_POD_SUBNET_PREFIX.1"}]],
            "routes": [{"dst": "$QC_NODE_IP/32"}]}}]}
JSON
  # Nothing from a pod leaves the machine, whatever its routes: dropped when forwarded anywhere but the bridge.
  iptables -w -N QC-NODE-EGRESS 2>/dev/null || iptables -w -F QC-NODE-EGRESS
  iptables -w -A QC-NODE-EGRESS -s "$QC_POD_SUBNET_PREFIX.0/24" ! -o "$QC_POD_BRIDGE" -j DROP
  iptables -w -C FORWARD -j QC-NODE-EGRESS 2>/dev/null || iptables -w -I FORWARD -j QC-NODE-EGRESS

  # containerd with a proxy that refuses: an image missing from the node fails to pull at once, locally.
  HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9 NO_PROXY='' \
    setsid containerd --config "$node/containerd.toml" >"$node/containerd.log" 2>&1 &
  echo $! >"$node/containerd.pid"
  for _ in $(seq 1 100); do
    ctr -a "$QC_NODE_CONTAINERD" version >/dev/null 2>&1 && break
    kill -0 "$(cat "$node/containerd.pid")" 2>/dev/null || break
    sleep 0.1
  done
  ctr -a "$QC_NODE_CONTAINERD" version >/dev/null 2>&1 || { k8s_node_fail "$run" "containerd did not start"; return 1; }
  k8s_node_pause_image "$run" || { k8s_node_fail "$run" "cannot import the pause image"; return 1; }

  # The kubelet's client certificate (system:node:NAME in system:nodes: the Node authorizer and
  # NodeRestriction admit it) and its serving certificate for the node's address.
  if ! { k8s_cert "$pki" kubelet "/O=system:nodes/CN=system:node:$QC_NODE_NAME" ca \
    "$(printf '%s\n' 'basicConstraints=CA:FALSE' 'keyUsage=critical,digitalSignature,keyEncipherment' 'extendedKeyUsage=clientAuth')" &&
    k8s_cert "$pki" kubelet-serving "/CN=$QC_NODE_NAME" ca "$(printf '%s\n' 'basicConstraints=CA:FALSE' \
      'keyUsage=critical,digitalSignature,keyEncipherment' 'extendedKeyUsage=serverAuth' \
      "subjectAltName=IP:$QC_NODE_IP,DNS:$QC_NODE_NAME")"; }; then
    k8s_node_fail "$run" "cannot make the kubelet's certificates"; return 1
  fi
  local server
  server=$(sed -n 's/.*server: "\([^"]*\)".*/\1/p' "$run/kubeconfig")
  k8s_kubeconfig "$node/kubelet.kubeconfig" "$server" "$pki/ca.crt" "$pki/kubelet.crt" "$pki/kubelet.key"
  local port healthz
  port=$(k8s_node_free_port) healthz=$(k8s_node_free_port)
  cat >"$node/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# The VM has hybrid cgroups (v1 controllers, a v2 mount without them).
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
cgroupRoot: /$QC_NODE_CGROUP_ROOT
containerRuntimeEndpoint: unix://$QC_NODE_CONTAINERD
podLogsDir: $node/pod-logs
address: $QC_NODE_IP
port: $port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $healthz
tlsCertFile: $pki/kubelet-serving.crt
tlsPrivateKeyFile: $pki/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
# No iptables chains of the kubelet's own on the host.
makeIPTablesUtilChains: false
# A test machine's disk is shared: evict late, and never collect the images imported here (no registry
# would give them back).
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
resolvConf: ""
registerWithTaints:
  - {key: $QC_NODE_TAINT_KEY, value: "true", effect: NoSchedule}
nodeStatusReportFrequency: 10s
YAML
  # The kubelet's cgroupRoot must exist in every hierarchy (cpuset's with the parent's CPUs and memory nodes).
  local h
  for h in /sys/fs/cgroup/*/; do
    [ "$h" = /sys/fs/cgroup/unified/ ] && continue
    mkdir -p "$h$QC_NODE_CGROUP_ROOT" || { k8s_node_fail "$run" "cannot make the cgroup $h$QC_NODE_CGROUP_ROOT"; return 1; }
    if [ -f "$h/cpuset.cpus" ]; then
      cat "$h/cpuset.cpus" >"$h$QC_NODE_CGROUP_ROOT/cpuset.cpus" && cat "$h/cpuset.mems" >"$h$QC_NODE_CGROUP_ROOT/cpuset.mems"
    fi
  done
  setsid "$QC_K8S_BIN/kubelet" --config "$node/kubelet.yaml" --kubeconfig "$node/kubelet.kubeconfig" \
    --hostname-override "$QC_NODE_NAME" --node-ip "$QC_NODE_IP" --root-dir "$node/kubelet" \
    --cert-dir "$node/kubelet/pki" --v=1 >"$node/kubelet.log" 2>&1 &
  echo $! >"$node/kubelet.pid"
  local deadline=$((SECONDS + 90)) ready=
  while [ "$SECONDS" -lt "$deadline" ]; do
    kill -0 "$(cat "$node/kubelet.pid")" 2>/dev/null || break
    ready=$(k8s_node_kubectl "$run" get node "$QC_NODE_NAME" \
      -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null || true)
    [ "$ready" = True ] && break
    sleep 0.5
  done
  [ "$ready" = True ] || { k8s_node_fail "$run" "the node $QC_NODE_NAME did not become Ready within 90 s"; return 1; }
  k8s_node_log "node $QC_NODE_NAME ($QC_NODE_IP; pods on $QC_POD_SUBNET_PREFIX.0/24) Ready in $((SECONDS - started)) s"
}

# kubectl as the cluster admin of RUN: from PATH or the cache ensure_helm fills.
k8s_node_kubectl() {
  local run=$1
  shift
  local kubectl
  kubectl=$(command -v kubectl || echo "$QC_CACHE/bin/kubectl")
  "$kubectl" --kubeconfig "$run/kubeconfig" "$@"
}

# The pause image from the pause binary: an image of one file, imported into containerd's k8s.io namespace.
k8s_node_pause_image() {
  local run=$1 dir
  dir=$(mktemp -d)
  mkdir -p "$dir/rootfs" && cp "$QC_K8S_BIN/pause" "$dir/rootfs/pause"
  # An OCI image layout by hand: one layer, a config naming /pause as the entrypoint, uid 65535 as upstream.
  python3 - "$dir" "$QC_PAUSE_IMAGE" <<'PY' || { rm -rf "$dir"; return 1; }
import hashlib, io, json, os, sys, tarfile
d, ref = sys.argv[1], sys.argv[2]
blobs = os.path.join(d, "layout", "blobs", "sha256")
os.makedirs(blobs)
def blob(data):
    h = hashlib.sha256(data).hexdigest()
    open(os.path.join(blobs, h), "wb").write(data)
    return {"digest": "sha256:" + h, "size": len(data)}
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
    info = t.gettarinfo(os.path.join(d, "rootfs", "pause"), arcname="pause")
    info.uid = info.gid = 0; info.uname = info.gname = ""; info.mtime = 0; info.mode = 0o755
    t.addfile(info, open(os.path.join(d, "rootfs", "pause"), "rb"))
layer = buf.getvalue()
diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
config = json.dumps({"architecture": "amd64", "os": "linux",
    "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
    "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": dict(blob(config), mediaType="application/vnd.oci.image.config.v1+json"),
    "layers": [dict(blob(layer), mediaType="application/vnd.oci.image.layer.v1.tar")]}).encode()
m = blob(manifest)
json.dump({"schemaVersion": 2, "manifests": [dict(m, mediaType="application/vnd.oci.image.manifest.v1+json",
    annotations={"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1]})]},
    open(os.path.join(d, "layout", "index.json"), "w"))
open(os.path.join(d, "layout", "oci-layout"), "w").write('{"imageLayoutVersion": "1.0.0"}')
PY
  tar -C "$dir/layout" -cf "$dir/pause.tar" . &&
    ctr -a "$QC_NODE_CONTAINERD" -n k8s.io images import --index-name "$QC_PAUSE_IMAGE" "$dir/pause.tar" >/dev/null
  local rc=$?
  rm -rf "$dir"
  return $rc
}

# Copies podman's IMAGEs into the node's containerd under the same names (pods use them with
# imagePullPolicy IfNotPresent; nothing is pulled). k8s_node_import RUN IMAGE...
k8s_node_import() {
  local run=$1 image
  shift
  QC_NODE_CONTAINERD=$run/node/containerd/containerd.sock
  for image in "$@"; do
    podman save --format oci-archive "$image" |
      ctr -a "$QC_NODE_CONTAINERD" -n k8s.io images import --index-name "$image" - >/dev/null ||
      { k8s_node_log "cannot import $image into the node"; return 1; }
  done
  k8s_node_log "imported into the node: $*"
}

k8s_node_fail() {
  local run=$1 f
  for f in containerd kubelet; do
    [ -f "$run/node/$f.log" ] || continue
    k8s_node_log "$run/node/$f.log (last lines):"; tail -8 "$run/node/$f.log" >&2
  done
  k8s_node_down "$run"
  k8s_node_log "$2"
}

k8s_node_stop_pid() {
  local file=$1 pid
  pid=$(cat "$file" 2>/dev/null) || return 0
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$file"
}

# Stops the node of RUN and undoes its host changes. Pods are stopped through containerd (every task
# killed, every sandbox's network torn down by CRI), then containerd and its shims, then the cgroups,
# namespaces, bridge, iptables chain, ip_forward and log symlinks. Safe to run twice, and after a failed up.
k8s_node_down() {
  local run=$1 node
  node=$(cd "$run" 2>/dev/null && pwd)/node
  [ -d "$node" ] || return 0
  k8s_node_stop_pid "$node/kubelet.pid"
  local sock=$node/containerd/containerd.sock ctr_=(ctr -a "$node/containerd/containerd.sock" -n k8s.io) id
  if [ -S "$sock" ] && "${ctr_[@]}" version >/dev/null 2>&1; then
    for id in $("${ctr_[@]}" tasks ls -q 2>/dev/null); do
      "${ctr_[@]}" tasks kill -a -s SIGKILL "$id" >/dev/null 2>&1 || true
    done
    for _ in $(seq 1 50); do
      [ -z "$("${ctr_[@]}" tasks ls -q 2>/dev/null | head -1)" ] && break
      # A killed task's exit must be collected before it leaves the list.
      for id in $("${ctr_[@]}" tasks ls -q 2>/dev/null); do "${ctr_[@]}" tasks rm -f "$id" >/dev/null 2>&1 || true; done
      sleep 0.2
    done
    for id in $("${ctr_[@]}" containers ls -q 2>/dev/null); do
      "${ctr_[@]}" containers rm "$id" >/dev/null 2>&1 || true
    done
  fi
  k8s_node_stop_pid "$node/containerd.pid"
  # Shims outlive containerd: those of this node's containerd (its socket on their command line).
  local pid
  for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $sock" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
  # Pod network namespaces: those whose sandbox was this node's (CRI names them cni-UUID and records the
  # path in the IPAM state's container ids); any left after CRI's own teardown.
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^cni-'); do
    if grep -rqs -- "$ns" "$node/containerd/root" 2>/dev/null || grep -rqs -- "$ns" "$node/containerd/state" 2>/dev/null; then
      ip netns delete "$ns" 2>/dev/null || true
    fi
  done
  ip link del "$QC_POD_BRIDGE" 2>/dev/null || true
  iptables -w -D FORWARD -j QC-NODE-EGRESS 2>/dev/null || true
  iptables -w -F QC-NODE-EGRESS 2>/dev/null || true
  iptables -w -X QC-NODE-EGRESS 2>/dev/null || true
  [ -f "$node/ip_forward.before" ] && cat "$node/ip_forward.before" >/proc/sys/net/ipv4/ip_forward
  # The kubelet's cgroups, deepest first, in every hierarchy.
  local h
  for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
    [ -d "$h$QC_NODE_CGROUP_ROOT" ] || continue
    find "$h$QC_NODE_CGROUP_ROOT" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  if [ -f "$node/fixed-dirs.made" ]; then
    local d
    # Deepest first; only the empty ones.
    sort -r "$node/fixed-dirs.made" | while read -r d; do
      [ -d "$d" ] && find "$d" -depth -type d -empty -delete 2>/dev/null
      true
    done
  fi
  local link
  for link in /var/log/containers/*.log; do
    [ -L "$link" ] && case "$(readlink "$link")" in "$node"/*) rm -f "$link" ;; esac
  done
  # containerd mounts the pods' root filesystems and its own shm/secrets under its state and the kubelet's
  # root: unmounted before the run directory is removed.
  grep -o " $node/[^ ]*" /proc/mounts 2>/dev/null | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
}

# What `down` must leave behind: nothing. Prints each leftover; returns 1 when there is one.
k8s_node_leftovers() {
  local run=$1 left=0 node
  node=$(cd "$run" 2>/dev/null && pwd)/node
  ip link show "$QC_POD_BRIDGE" >/dev/null 2>&1 && { echo "bridge $QC_POD_BRIDGE"; left=1; }
  iptables -w -S QC-NODE-EGRESS >/dev/null 2>&1 && { echo "iptables chain QC-NODE-EGRESS"; left=1; }
  find /sys/fs/cgroup -mindepth 2 -maxdepth 2 -name "$QC_NODE_CGROUP_ROOT" | sed 's/^/cgroup /' | grep . && left=1
  grep " $node/" /proc/mounts | sed 's/^/mount /' | grep . && left=1
  pgrep -f "$node" | sed 's/^/process /' | grep . && left=1
  return $left
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  # shellcheck source=scripts/k8s-cluster.sh
  source "$(dirname "$0")/k8s-cluster.sh"
  case "${1:-}" in
    network-up) k8s_node_ensure && k8s_node_network_up ;;
    network-down) k8s_node_network_down ;;
    up) k8s_node_up "${2:?RUN_DIR}" ;;
    import) run=${2:?RUN_DIR}; shift 2; k8s_node_import "$run" "$@" ;;
    down) k8s_node_down "${2:?RUN_DIR}" && k8s_node_leftovers "$2" ;;
    *) echo "usage: $0 network-up | network-down | up RUN_DIR | import RUN_DIR IMAGE... | down RUN_DIR" >&2; exit 2 ;;
  esac
fi
