#!/usr/bin/env bash
# Stage, on a machine with PyPI, the Python 3.12 wheels the GPU host lacks to run the whole platform there
# (API, Celery worker, Ray head with its dashboard, megatron-core), not only the pipeline. The host's image
# has torch, transformers and their requirements (../shared/device/README.md) but no network, and each call
# carries at most 64 MiB: the wheels go into two ignored folders, `.devwheels/a` and `.devwheels/b`, with
# Ray's 77 MiB wheel split across them. On the host, one call after the other (it stays warm ~30 s):
#   carry [".devwheels/a"]:  bash .devwheels/a/install.sh
#   carry [".devwheels/b"]:  bash .devwheels/b/install.sh && export PYTHONPATH=/root/site:$PWD && ...
# The versions are this checkout's venv's, so the host runs what the suite tests.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
venv_version() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }
pins=()
for pkg in ray fastapi uvicorn sqlalchemy alembic celery kombu pydantic pydantic-settings httpx typer rich psutil; do
  pins+=("$pkg==$(venv_version "$pkg")")
done
pins[0]="ray[default]==$(venv_version ray)"
pins[5]="celery[sqlalchemy]==$(venv_version celery)"
rm -rf .devwheels && mkdir -p .devwheels/dl .devwheels/a .devwheels/b
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
  --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
python3 -m pip download -q "${plat[@]}" -d .devwheels/dl "${pins[@]}" 2>&1 | grep -v '^WARNING: Location' || true
python3 -m pip download -q --no-deps "${plat[@]}" -d .devwheels/dl megatron-core==0.19.2 2>&1 \
  | grep -v '^WARNING: Location' || true
# what the GPU image already holds for transformers (shadowing them from /root/site gains nothing)
for have in requests urllib3 idna certifi charset_normalizer pyyaml PyYAML packaging filelock typing_extensions; do
  rm -f .devwheels/dl/"$have"-*.whl
done
ray_whl=$(ls .devwheels/dl/ray-*.whl)
split -b 38M "$ray_whl" .devwheels/a/ray.part.
mv .devwheels/a/ray.part.ab .devwheels/b/
basename "$ray_whl" > .devwheels/b/ray.name
rm "$ray_whl"
# the other wheels, largest first, into whichever folder has more room (each stays under 62 MiB)
for whl in $(ls -S .devwheels/dl/*.whl); do
  a=$(du -sk .devwheels/a | cut -f1); b=$(du -sk .devwheels/b | cut -f1)
  if [ "$a" -le "$b" ]; then mv "$whl" .devwheels/a/; else mv "$whl" .devwheels/b/; fi
done
rmdir .devwheels/dl
cat > .devwheels/a/install.sh <<'IN'
set -e; d=$(dirname "$0"); mkdir -p /root/stash/wheels; cp "$d"/ray.part.aa /root/stash/; cp "$d"/*.whl /root/stash/wheels/
echo "part a stashed: $(ls /root/stash/wheels | wc -l) wheels"
IN
cat > .devwheels/b/install.sh <<'IN'
set -e; d=$(dirname "$0"); name=$(cat "$d/ray.name")
cat /root/stash/ray.part.aa "$d/ray.part.ab" > "/root/stash/$name"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site \
  "/root/stash/$name" /root/stash/wheels/*.whl "$d"/*.whl
mkdir -p /root/bin && ln -sf /root/site/bin/* /root/bin/ 2>/dev/null || true
echo "installed into /root/site: export PYTHONPATH=/root/site PATH=/root/site/bin:\$PATH"
IN
du -sh .devwheels/a .devwheels/b
for f in a b; do
  if [ "$(du -sm .devwheels/$f | cut -f1)" -gt 63 ]; then echo "error: .devwheels/$f is over 63 MiB" >&2; exit 1; fi
done
