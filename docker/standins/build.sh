#!/usr/bin/env bash
# Local stand-ins for the public images that compose.yaml and the Dockerfile name, for a Docker host that cannot
# pull from Docker Hub but reaches Debian's archive (and PyPI and npm for the platform's own build): each is built
# from Debian bookworm's packages and tagged with the public name, so `docker compose` runs unchanged.
#   python:3.11-slim   Debian's Python 3.11 (python.Dockerfile)    node:20-slim     Node 20, npm (node.Dockerfile)
#   postgres:16-alpine Debian's PostgreSQL 15 (postgres.Dockerfile) redis:7-alpine   Debian's Redis 7.0
#   nginx:1.27-alpine  Debian's nginx 1.22
# An image already present under a public name (pulled) is left as it is unless --force.
# The base: --base IMAGE (default debian:bookworm, when it can be pulled or is present), or --debootstrap: a
# minimal bookworm from Debian's archive (needs root and debootstrap), imported as relax-standin/debian:bookworm.
# --ca FILE (repeatable): a certificate authority to trust inside the images (an intercepting egress proxy's).
# Usage: docker/standins/build.sh [--base IMAGE | --debootstrap] [--ca FILE ...] [--force]      (docs/deploy.md)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
base=debian:bookworm force=0 boot=0
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
mkdir "$ctx/extra-ca"
while [ $# -gt 0 ]; do
  case $1 in
    --base) base=$2; shift 2 ;;
    --debootstrap) boot=1; shift ;;
    --ca) cp "$2" "$ctx/extra-ca/$(basename "${2%.*}").crt"; shift 2 ;;
    --force) force=1; shift ;;
    *) echo "usage: $0 [--base IMAGE | --debootstrap] [--force]" >&2; exit 2 ;;
  esac
done
if [ "$boot" = 1 ]; then
  base=relax-standin/debian:bookworm
  if ! docker image inspect "$base" >/dev/null 2>&1; then
    root=$ctx/rootfs
    debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >/dev/null
    tar -C "$root" -c . | docker import - "$base" >/dev/null
  fi
fi
docker image inspect "$base" >/dev/null 2>&1 || docker pull "$base"
cp "$here"/*.Dockerfile "$here"/*.sh "$ctx/"
docker build -q --build-arg "BASE=$base" -f "$ctx/base.Dockerfile" -t relax-standin/base "$ctx" >/dev/null
for pair in python:python:3.11-slim node:node:20-slim postgres:postgres:16-alpine redis:redis:7-alpine \
  nginx:nginx:1.27-alpine; do
  file=${pair%%:*} tag=${pair#*:}
  if [ "$force" = 0 ] && docker image inspect "$tag" >/dev/null 2>&1; then
    echo "$tag: present, left as it is"
    continue
  fi
  docker build -q --build-arg BASE=relax-standin/base -f "$ctx/$file.Dockerfile" -t "$tag" "$ctx" >/dev/null
  echo "$tag: built from $base ($file.Dockerfile)"
done
