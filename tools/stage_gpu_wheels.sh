#!/usr/bin/env bash
# Stage, on a machine with PyPI, the wheels `make run WHEELS=DIR` needs on an offline GPU host whose own Python
# (3.12, x86_64) already has a CUDA torch and transformers (the device host: /work/shared/device/README.md):
# the platform's requirements (API, Celery, Ray with its dashboard, megatron-core) at this checkout's venv's
# versions, less what that host's image already holds. Each call to the host carries at most 64 MiB, so the
# wheels go into ignored folders of at most $PART_MIB MiB each (default 52: the working tree travels too, ~7 MiB),
# `.devwheels/p1`, `.devwheels/p2` (Ray's ~76 MiB wheel split in two across them), each with an `install.sh`
# that copies its part into one folder on the host (default /root/wheels; the last part joins Ray's wheel).
# On the host, one call right after the other, on the same machine (it stays warm only ~30 s between calls,
# and a fresh one has lost the first part):
#   carry [".devwheels/p1"]:  bash .devwheels/p1/install.sh
#   carry [".devwheels/p2"]:  bash .devwheels/p2/install.sh && make run WHEELS=/root/wheels
# `make install WHEELS=/root/wheels` makes .venv over the host's Python (its torch kept) and installs from
# the folder offline. Usage: tools/stage_gpu_wheels.sh [EXTRA==VERSION ...]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
out=.devwheels
limit_kib=$((${PART_MIB:-52} * 1024))
grep -qx '/.devwheels/' .git/info/exclude 2>/dev/null || git check-ignore -q "$out/" \
  || echo '/.devwheels/' >>.git/info/exclude
venv_version() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }
pins=()
for spec in "ray[default]:ray" fastapi uvicorn httptools sqlalchemy alembic "celery[redis,sqlalchemy]:celery" \
  pydantic pydantic-settings "psycopg[binary]:psycopg" python-multipart typer; do
  pins+=("${spec%%:*}==$(venv_version "${spec##*:}")")
done
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
rm -rf "$out" && mkdir -p "$out/dl"
python3 -m pip download -q "${plat[@]}" -d "$out/dl" "${pins[@]}" "$@"
# megatron-core alone: its requirements (torch, numpy, packaging) are the host's
python3 -m pip download -q --no-deps "${plat[@]}" -d "$out/dl" megatron-core==0.19.2
# What the GPU host's image already holds (its `pip list`, 2026-12-06): its versions are used, not shadowed
# (typer is staged: the CLI needs a newer one than the image's 0.27).
for have in torch numpy packaging filelock typing_extensions requests urllib3 idna certifi charset_normalizer \
  pyyaml PyYAML click rich markdown_it_py mdurl pygments httpx httpcore h11 anyio psutil uvloop \
  prometheus_client aiohttp aiosignal aiohappyeyeballs frozenlist multidict yarl propcache attrs protobuf \
  grpcio msgpack jinja2 MarkupSafe six python_dateutil shellingham annotated_doc sniffio \
  virtualenv distlib python_discovery py_spy; do  # (the last four: Ray's runtime_env pip and its profiler)
  rm -f "$out/dl/$have"-*.whl "$out/dl/${have,,}"-*.whl
done
ray_whl=$(ls "$out"/dl/ray-*.whl)
basename "$ray_whl" >"$out/dl/ray.name"
split -n 2 "$ray_whl" "$out/dl/ray.part."
rm "$ray_whl"
# Fill p1, p2, ... in turn, largest files first, each up to the limit.
n=1
mkdir -p "$out/p$n"
for f in $(ls -S "$out"/dl/*); do
  size=$(du -k "$f" | cut -f1)
  placed=""
  for d in "$out"/p*; do
    if [ $(($(du -sk "$d" | cut -f1) + size)) -le $limit_kib ]; then mv "$f" "$d/"; placed=1; break; fi
  done
  if [ -z "$placed" ]; then n=$((n + 1)); mkdir -p "$out/p$n"; mv "$f" "$out/p$n/"; fi
done
rmdir "$out/dl"
last="$out/p$n"
for d in "$out"/p*; do
  cat >"$d/install.sh" <<'IN'
# Copies this part's files into the wheel folder ($1, default /root/wheels); the part holding ray.name joins
# Ray's wheel once every part of it is there.
set -e; d=$(dirname "$0"); dest=${1:-/root/wheels}; mkdir -p "$dest"
cp "$d"/* "$dest"/; rm -f "$dest/install.sh"
if [ -f "$dest/ray.name" ] && [ "$(ls "$dest"/ray.part.* | wc -l)" = "$(cat "$dest/ray.parts")" ]; then
  cat "$dest"/ray.part.* >"$dest/$(cat "$dest/ray.name")" && rm "$dest"/ray.part.* "$dest/ray.name" "$dest/ray.parts"
fi
echo "$d -> $dest: $(ls "$dest"/*.whl | wc -l) wheels$(ls "$dest"/ray.part.* >/dev/null 2>&1 && echo ', ray still in parts')"
IN
done
# every part knows how many ray parts there are (whichever arrives last joins them)
parts=$(ls "$out"/p*/ray.part.* | wc -l)
for d in "$out"/p*; do echo "$parts" >"$d/ray.parts"; done
du -sh "$out"/p*
echo "on the host, in order: bash .devwheels/p1/install.sh; ... ; bash $last/install.sh; make run WHEELS=/root/wheels"
