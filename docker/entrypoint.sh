#!/bin/sh
# Roles of the production image. Settings come from RELAX_* variables (see scheduler/settings.py).
set -eu
role="${1:-api}"
[ $# -gt 0 ] && shift
case "$role" in
  migrate)
    exec python -m scheduler.db.migrate ;;
  api)
    python -m scheduler.db.migrate
    exec uvicorn api.app:create_app --factory --host "${RELAX_HOST:-0.0.0.0}" --port "${RELAX_PORT:-8400}" \
      --proxy-headers --workers "${RELAX_API_WORKERS:-2}" "$@" ;;
  scheduler)
    # the beat that triggers passes, and the worker that runs them
    exec celery -A scheduler.worker worker --beat -Q scheduler -P threads -c 2 \
      -n "scheduler@%h" --loglevel INFO "$@" ;;
  worker)
    pool="${1:?usage: worker POOL}"
    shift
    exec celery -A scheduler.worker worker -Q "pool.${pool}" -P threads -c "${RELAX_WORKER_THREADS:-8}" \
      -n "pool-${pool}@%h" --loglevel INFO "$@" ;;
  *)
    exec "$role" "$@" ;;
esac
