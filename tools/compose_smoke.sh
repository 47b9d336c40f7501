#!/usr/bin/env bash
# compose.yaml under a real Docker engine, end to end (issue 14 item 6; docs/deploy.md, "What was run"): builds the
# two images, starts every service, waits for their health checks, builds the tiny model and datasets on the
# shared volume (on the Ray head, which has torch), runs tools/compose_check.py against the published port, and
# takes it all down again (volumes included) unless --keep.
# Needs a Docker engine and `docker compose` (v2) or docker-compose 1.29 (which refuses the file's top-level
# `name:`: the project is then named with -p, from a copy of the file without that line). Makes .env with fresh
# secrets if there is none (and removes it at the end), else uses it. Images the host cannot pull:
# docker/standins/build.sh first. Usage: tools/compose_smoke.sh [--keep] [--jobs N]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
keep=0 jobs=8
while [ $# -gt 0 ]; do
  case $1 in
    --keep) keep=1; shift ;;
    --jobs) jobs=$2; shift 2 ;;
    *) echo "usage: $0 [--keep] [--jobs N]" >&2; exit 2 ;;
  esac
done
made_env=0 v1_file=
cleanup() {
  if [ "$keep" = 0 ]; then compose down -v --remove-orphans >/dev/null 2>&1 || true; fi
  if [ -n "$v1_file" ]; then rm -f "$v1_file"; fi
  if [ "$made_env" = 1 ] && [ "$keep" = 0 ]; then rm -f .env; fi
}
if docker compose version >/dev/null 2>&1; then
  compose() { docker compose -p relax "$@"; }
else
  v1_file=.compose-v1.yaml  # beside compose.yaml: its relative paths (build context, nginx.conf) stay right
  grep -v '^name: ' compose.yaml >"$v1_file"
  compose() { docker-compose -p relax -f "$v1_file" "$@"; }
fi
trap cleanup EXIT
if [ ! -f .env ]; then
  made_env=1
  sed -e "s/^POSTGRES_PASSWORD=.*/POSTGRES_PASSWORD=$(openssl rand -hex 16)/" \
    -e "s/^RELAX_SECRET_KEY=.*/RELAX_SECRET_KEY=$(openssl rand -hex 32)/" \
    -e "s/^RELAX_BOOTSTRAP_ADMIN_KEY=.*/RELAX_BOOTSTRAP_ADMIN_KEY=rlx_$(openssl rand -hex 16)/" .env.example >.env
fi
set -a && . ./.env && set +a
began=$(date +%s)
compose build
built=$(date +%s)
compose up -d
# every long-running service healthy (ray-worker has no health check: running), the one-shots exited 0
want="postgres redis api-1 api-2 proxy scheduler-1 scheduler-2 worker ray-head"
ids=() && for s in $want migrate register-pool; do ids+=("$(compose ps -q "$s")"); done
deadline=$(($(date +%s) + 360)) ok=0
while [ "$(date +%s)" -lt "$deadline" ]; do
  states=$(docker inspect -f '{{.Name}} {{.State.Status}} {{.State.ExitCode}} {{if .State.Health}}{{.State.Health.Status}}{{end}}' "${ids[@]}")
  if ! grep -v -E ' running 0 healthy$|(migrate|register-pool)[-_][0-9]+ exited 0 ' <<<"$states" | grep -q .; then ok=1 && break; fi
  sleep 2
done
if [ "$ok" != 1 ]; then echo "$states"; echo "services not healthy after 360 s" >&2; exit 1; fi
up=$(date +%s)
echo "images built in $((built - began)) s; every service healthy $((up - built)) s after \`up\`"
compose ps
url=http://localhost:${RELAX_PUBLISHED_PORT:-8400}
compose exec -T -e RELAX_URL=http://proxy:8400 -e RELAX_API_KEY="$RELAX_BOOTSTRAP_ADMIN_KEY" ray-head \
  relaxctl models tiny >/dev/null
"${PYTHON:-.venv/bin/python}" -m tools.compose_check --url "$url" --api-key "$RELAX_BOOTSTRAP_ADMIN_KEY" --jobs "$jobs"
for s in api-1 api-2; do echo "$s: $(compose logs "$s" 2>&1 | grep -c 'POST /v1/jobs') submissions"; done
for s in scheduler-1 scheduler-2; do echo "$s: $(compose logs "$s" 2>&1 | grep -c 'scheduling pass:') passes"; done
