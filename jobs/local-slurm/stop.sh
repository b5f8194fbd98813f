#!/usr/bin/env bash
# Stop the one-node Slurm that start.sh started: cancel its jobs, then stop
# slurmd, slurmctld and (when start.sh started it) munged, by their pid files.
# Harmless when nothing is running. LOCAL_SLURM_DIR as for start.sh.
set -uo pipefail
DIR=${LOCAL_SLURM_DIR:-/tmp/spmdnet-slurm}
export SLURM_CONF=$DIR/slurm.conf

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
stop() {  # pid file, name
  alive "$1" || { rm -f "$1"; return 0; }
  local pid
  pid=$(cat "$1")
  kill "$pid" 2>/dev/null
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "local-slurm: $2 ($pid) ignores SIGTERM; killing it"
    kill -KILL "$pid" 2>/dev/null
  fi
  rm -f "$1"
  echo "local-slurm: stopped $2 ($pid)"
}

if alive "$DIR/slurmctld.pid" && [ -f "$SLURM_CONF" ]; then
  # running jobs end before their slurmd goes away (no orphaned ranks)
  scancel --quiet --partition=local 2>/dev/null
  for _ in $(seq 50); do
    [ -z "$(squeue -h -t running,completing -o %i 2>/dev/null)" ] && break
    sleep 0.2
  done
fi
stop "$DIR/slurmd.pid" slurmd
stop "$DIR/slurmctld.pid" slurmctld
stop "$DIR/munged.pid" munged
exit 0
