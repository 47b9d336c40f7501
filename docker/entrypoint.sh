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
    # the platform's log lines (JSON, or text with RELAX_LOG_FORMAT=text) from uvicorn's parent and workers
    log_config="$(mktemp -t relax-api-logging.XXXXXX.json)"
    python -m scheduler.logs uvicorn-config api > "$log_config"
    exec uvicorn api.app:create_app --factory --host "${RELAX_HOST:-0.0.0.0}" --port "${RELAX_PORT:-8400}" \
      --proxy-headers --workers "${RELAX_API_WORKERS:-2}" --log-config "$log_config" "$@" ;;
  scheduler)
    # the beat that triggers passes, and the worker that runs them (--quiet: log lines only, no banner)
    exec celery -A scheduler.worker --quiet worker --beat -Q scheduler -P threads -c 2 \
      -n "scheduler@%h" --loglevel INFO "$@" ;;
  worker)
    pool="${1:?usage: worker POOL}"
    shift
    exec celery -A scheduler.worker --quiet worker -Q "pool.${pool}" -P threads -c "${RELAX_WORKER_THREADS:-8}" \
      -n "pool-${pool}@%h" --loglevel INFO "$@" ;;
  *)
    exec "$role" "$@" ;;
esac
