#!/usr/bin/env bash
# Start a one-node Slurm on this machine (munged, slurmctld, slurmd), for trying
# the job scripts in jobs/ and for CI. Needs root; installs Debian's slurm-wlm and
# munge with apt-get when they are missing. Idempotent: when the cluster is
# already up it only prints how to use it. Stop it with stop.sh.
#
#   jobs/local-slurm/start.sh && export SLURM_CONF=/tmp/spmdnet-slurm/slurm.conf
#   sbatch --wait jobs/train_mlp_cpu.sbatch
#
# Settings (environment):
#   LOCAL_SLURM_DIR   state, spool, logs, pid files and slurm.conf [/tmp/spmdnet-slurm]
#   LOCAL_SLURM_CPUS  CPUs the node offers, more than its cores is fine [8]
#   LOCAL_SLURM_GPUS  fake GPUs (gres gpu:fake:N) so that GPU job scripts run [4]
#   LOCAL_SLURM_PORT  slurmctld's port; slurmd uses the next one [6917]
#   LOCAL_SLURM_CRED_EXPIRE  seconds; also how long a requeued job waits to restart [10]
#
# `start.sh --packages-only` installs the packages and starts munged, and stops there
# (the two-node Slurm of tests/test_multinode.py starts its own daemons).
#
# Exit codes: 0 up, 77 Slurm cannot be provided here (not root, no apt-get, the
# install failed), 1 the daemons did not come up (see the logs it names).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
DIR=${LOCAL_SLURM_DIR:-/tmp/spmdnet-slurm}
CPUS=${LOCAL_SLURM_CPUS:-8}
GPUS=${LOCAL_SLURM_GPUS:-4}
PORT=${LOCAL_SLURM_PORT:-6917}
CONF=$DIR/slurm.conf
HOST=$(hostname -s)
export SLURM_CONF=$CONF

say() { echo "local-slurm: $*"; }
cannot() { echo "local-slurm: cannot start Slurm here: $*" >&2; exit 77; }
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
node_state() { sinfo -h -n "$HOST" -o %T 2>/dev/null | head -n1 || true; }
ready() { alive "$DIR/slurmctld.pid" && alive "$DIR/slurmd.pid" &&
          [[ $(node_state) =~ ^(idle|mixed|allocated|completing)$ ]]; }  # no * (not responding)

PACKAGES_ONLY=0
[ "${1:-}" = --packages-only ] && PACKAGES_ONLY=1
if [ "$PACKAGES_ONLY" = 0 ] && [ -f "$CONF" ] && ready; then
  say "already up (node $HOST $(node_state)); export SLURM_CONF=$CONF"
  exit 0
fi

# -- packages --------------------------------------------------------------------
[ "$(id -u)" -eq 0 ] || cannot "needs root (it installs packages and runs slurmd as root)"
mkdir -p "$DIR/state" "$DIR/spool"
missing=()
for tool in munged mungekey slurmctld slurmd sbatch; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || cannot "${missing[*]} missing and no apt-get to install them"
  say "installing slurm-wlm and munge with apt-get (missing: ${missing[*]})"
  apt_get() { DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=120 "$@" \
            >>"$DIR/apt.log" 2>&1; }
  if ! apt_get install -y --no-install-recommends slurm-wlm munge; then
    apt_get update || true  # a fresh machine has no package lists yet
    apt_get install -y --no-install-recommends slurm-wlm munge ||
      cannot "apt-get install slurm-wlm munge failed; see $DIR/apt.log"
  fi
fi

# -- munge -------------------------------------------------------------------------
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
  mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
  if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null ||
      dd if=/dev/urandom of=/etc/munge/munge.key bs=128 count=1 status=none
  fi
  if id munge >/dev/null 2>&1; then
    chown munge:munge /etc/munge /etc/munge/munge.key /run/munge /var/lib/munge /var/log/munge
    chmod 0700 /etc/munge
    chmod 0400 /etc/munge/munge.key
    chmod 0755 /run/munge
    runuser -u munge -- munged || munged --force
  else
    munged --force
  fi
  cp /run/munge/munged.pid "$DIR/munged.pid"  # ours: stop.sh stops it again
  for _ in $(seq 50); do
    munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break
    sleep 0.1
  done
  munge -n </dev/null | unmunge >/dev/null || { echo "local-slurm: munged does not answer;" \
    "see /var/log/munge/munged.log" >&2; exit 1; }
fi

if [ "$PACKAGES_ONLY" = 1 ]; then
  say "slurm-wlm and munge installed, munged answers"
  exit 0
fi

# -- slurm.conf and the daemons -------------------------------------------------------
# fake GPUs: character devices (like /dev/null) that Slurm hands out as gres
node_gres=""
rm -f "$DIR/gres.conf"
if [ "$GPUS" -gt 0 ]; then
  for i in $(seq 0 $((GPUS - 1))); do
    [ -c "$DIR/fake-gpu$i" ] || mknod "$DIR/fake-gpu$i" c 1 3 2>/dev/null || break
  done
  if [ -c "$DIR/fake-gpu$((GPUS - 1))" ]; then
    node_gres="Gres=gpu:fake:$GPUS"
    echo "NodeName=$HOST Name=gpu Type=fake File=$DIR/fake-gpu[0-$((GPUS - 1))]" \
      >"$DIR/gres.conf"
  else
    say "cannot create fake GPU devices (mknod); the node has no GPUs"
  fi
fi
memory=$(awk '/^MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
sed -e "s|@HOST@|$HOST|g" -e "s|@DIR@|$DIR|g" -e "s|@CPUS@|$CPUS|g" \
    -e "s|@CTLD_PORT@|$PORT|g" -e "s|@SLURMD_PORT@|$((PORT + 1))|g" \
    -e "s|@MEMORY@|$memory|g" -e "s|@NODE_GRES@|$node_gres|g" \
    -e "s|@CRED_EXPIRE@|${LOCAL_SLURM_CRED_EXPIRE:-10}|g" \
    "$here/slurm.conf.in" >"$CONF"

alive "$DIR/slurmctld.pid" || slurmctld -f "$CONF"  # keeps its state: job ids go on
alive "$DIR/slurmd.pid" || slurmd -f "$CONF"

for _ in $(seq 120); do
  state=$(node_state)
  case $state in
    idle|mixed|allocated|completing) break ;;
    down*|drain*) scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true ;;
  esac
  sleep 0.5
done
if ! ready; then
  echo "local-slurm: node $HOST is '${state:-unknown}', not idle, after 60 s;" \
       "see $DIR/slurmctld.log and $DIR/slurmd.log" >&2
  exit 1
fi
say "up: node $HOST with $CPUS CPUs${node_gres:+ and $GPUS fake GPUs}, partition local;" \
    "export SLURM_CONF=$CONF"
