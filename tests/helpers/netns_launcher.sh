#!/bin/sh
# hydra's "ssh" for the two namespace hosts of tests/helpers/netns.py:
#   netns_launcher.sh [-x] ADDR COMMAND-STRING...
# runs the command in the network namespace of ADDR, under that host's
# hostname, as ssh would on that host. NETNS_HOSTS maps addresses:
# ADDR=NETNS=HOSTNAME,...
[ "$1" = -x ] && shift
addr=$1
shift
for entry in $(echo "${NETNS_HOSTS:-}" | tr ',' ' '); do
  case $entry in
    "$addr"=*)
      rest=${entry#*=}
      netns=${rest%%=*}
      name=${rest#*=}
      # hydra passes one command line for a remote shell: let sh parse it
      exec ip netns exec "$netns" unshare --uts -- sh -c 'hostname "$0" && eval "exec $1"' \
        "$name" "$*"
      ;;
  esac
done
echo "netns_launcher.sh: no host $addr in NETNS_HOSTS='${NETNS_HOSTS:-}'" >&2
exit 255
