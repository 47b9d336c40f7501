#!/bin/sh
# Roles of the production image. Settings come from RELAX_* variables (see scheduler/settings.py).
#   migrate | api | scheduler | worker POOL       the control plane (image target `platform`)
#   register-pool                                 one-shot: a Ray cluster made a pool (docker/register_pool.py)
#   ray-head | ray-worker                         a Ray cluster's nodes (image target `ray`: the `runtime` extra)
# compose.yaml runs them all (docs/deploy.md).
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
role="${1:-api}"
[ $# -gt 0 ] && shift
# Prometheus multiprocess mode (docs/observability.md): each role writes its measurements (request latency, pass
# durations, reports ingested) under its own folder of RELAX_METRICS_DIR, emptied at the role's start; the API's
# /metrics merges every folder there (share RELAX_HOME's volume between the containers to see the scheduler's).
# Replicas of one role on a shared volume each need a folder of their own (their processes' ids collide across
# containers): RELAX_METRICS_NAME names it (compose.yaml: api-1, api-2, scheduler-1, ...)
export RELAX_METRICS_DIR="${RELAX_METRICS_DIR:-${RELAX_HOME:-.relax}/run/prometheus}"
metrics_dir() {
  export PROMETHEUS_MULTIPROC_DIR="$RELAX_METRICS_DIR/${RELAX_METRICS_NAME:-$1}"
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
    # gossip, mingle and event heartbeats: scheduler/celery_app.py::WORKER_FLAGS says why). Every replica runs a
    # beat; passes take a lock (scheduler/scheduling.py), so two replicas never run two passes at once. The beat's
    # state file: RELAX_BEAT_SCHEDULE_FILE, one per replica (not on a volume they share)
    exec celery -A scheduler.worker --quiet worker --beat -Q scheduler -P threads -c 2 \
      -s "${RELAX_BEAT_SCHEDULE_FILE:-${RELAX_HOME:-.relax}/celerybeat-schedule}" \
      -n "scheduler@%h" --without-gossip --without-mingle --without-heartbeat --loglevel INFO "$@" ;;
  worker)
    pool="${1:?usage: worker POOL}"
    shift
    metrics_dir "worker-${pool}"
    exec celery -A scheduler.worker --quiet worker -Q "pool.${pool}" -P threads -c "${RELAX_WORKER_THREADS:-8}" \
      -n "pool-${pool}@%h" --without-gossip --without-mingle --without-heartbeat --loglevel INFO "$@" ;;
  register-pool)
    exec python "$here/register_pool.py" "$@" ;;
  ray-head|ray-worker)
    # Token auth on every Ray endpoint (as the embedded platform's Ray, api/embedded.py::ray_environment): the
    # token is the pool's file under RELAX_HOME/ray_tokens, which the platform sends to the Jobs API; the head
    # creates it on the shared volume, the workers and the drivers read it.
    pool="${RELAX_POOL:-cluster}"
    export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="${RELAX_HOME:-.relax}/ray_tokens/${pool}"
    unset RAY_AUTH_TOKEN
    if [ "$role" = ray-head ]; then
      # 0600, written whole, kept when it exists (scheduler/secret_files.py)
      python -c "import sys, secrets, pathlib; from scheduler.secret_files import create_secret_file as c; \
c(pathlib.Path(sys.argv[1]), secrets.token_hex(32))" "$RAY_AUTH_TOKEN_PATH"
      exec ray start --head --block --disable-usage-stats --node-name "${RELAX_RAY_NODE_NAME:-ray-head}" \
        --port "${RELAX_RAY_GCS_PORT:-6379}" --dashboard-host 0.0.0.0 \
        --dashboard-port "${RELAX_RAY_DASHBOARD_PORT:-8265}" \
        --num-gpus "${RELAX_RAY_HEAD_GPUS:-0}" "$@"
    fi
    while [ ! -s "$RAY_AUTH_TOKEN_PATH" ]; do sleep 1; done  # the head writes it
    exec ray start --block --disable-usage-stats --node-name "${RELAX_RAY_NODE_NAME:-$(hostname)}" \
      --address "${RELAX_RAY_HEAD_ADDRESS:-ray-head:6379}" "$@" ;;
  *)
    exec "$role" "$@" ;;
esac
