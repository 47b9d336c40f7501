#!/bin/sh
# Roles of the production image. Settings come from RELAX_* variables (see scheduler/settings.py).
set -eu
role="${1:-api}"
[ $# -gt 0 ] && shift
# Prometheus multiprocess mode (docs/observability.md): each role writes its measurements (request latency, pass
# durations, reports ingested) under its own folder of RELAX_METRICS_DIR, emptied at the role's start; the API's
# /metrics merges every folder there (share RELAX_HOME's volume between the containers to see the scheduler's)
export RELAX_METRICS_DIR="${RELAX_METRICS_DIR:-${RELAX_HOME:-.relax}/run/prometheus}"
metrics_dir() {
  export PROMETHEUS_MULTIPROC_DIR="$RELAX_METRICS_DIR/$1"
  mkdir -p "$PROMETHEUS_MULTIPROC_DIR"
  rm -f "$PROMETHEUS_MULTIPROC_DIR"/*.db
}
case "$role" in
  migrate)
    exec python -m scheduler.dbinit ;;
  api)
    python -m scheduler.dbinit
    metrics_dir api
    # the platform's log lines (JSON, or text with RELAX_LOG_FORMAT=text) from uvicorn's parent and workers
    log_config="$(mktemp -t relax-api-logging.XXXXXX.json)"
    python -m scheduler.logs uvicorn-config api > "$log_config"
    exec uvicorn api.app:create_app --factory --host "${RELAX_HOST:-0.0.0.0}" --port "${RELAX_PORT:-8400}" \
      --proxy-headers --workers "${RELAX_API_WORKERS:-2}" --log-config "$log_config" "$@" ;;
  scheduler)
    metrics_dir scheduler
    # the beat that triggers passes, and the worker that runs them (--quiet: log lines only, no banner; without
    # gossip, mingle and event heartbeats: scheduler/celery_app.py::WORKER_FLAGS says why)
    exec celery -A scheduler.worker --quiet worker --beat -Q scheduler -P threads -c 2 \
      -n "scheduler@%h" --without-gossip --without-mingle --without-heartbeat --loglevel INFO "$@" ;;
  worker)
    pool="${1:?usage: worker POOL}"
    shift
    metrics_dir "worker-${pool}"
    exec celery -A scheduler.worker --quiet worker -Q "pool.${pool}" -P threads -c "${RELAX_WORKER_THREADS:-8}" \
      -n "pool-${pool}@%h" --without-gossip --without-mingle --without-heartbeat --loglevel INFO "$@" ;;
  *)
    exec "$role" "$@" ;;
esac
