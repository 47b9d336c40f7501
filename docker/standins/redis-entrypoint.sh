#!/bin/sh
# redis-server [options] -> as user redis, listening on every interface without protected mode
set -e
if [ "$1" = redis-server ]; then
  shift
  exec setpriv --reuid=redis --regid=redis --init-groups redis-server --bind 0.0.0.0 --protected-mode no "$@"
fi
exec "$@"
