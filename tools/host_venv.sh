#!/usr/bin/env bash
# `make install` on a GPU host (Makefile: WHEELS=DIR given, or a CUDA torch importable by $(PYTHON)): .venv over
# the host's own Python, whose CUDA torch (and transformers, triton, ...) it keeps, with the platform installed
# beside them; offline from a wheel folder when one is given (tools/stage_gpu_wheels.sh stages it).
#   bash tools/host_venv.sh VENV PYTHON [WHEELS]
set -euo pipefail
venv=$1 python=$2 wheels=${3:-}
cd "$(dirname "$0")/.."
"$python" -m venv --system-site-packages "$venv"
# The host's Python may itself be a venv (the device host's is /opt/torch/.venv): its packages are not "system"
# ones to the new venv, so a .pth puts its site-packages on the path, after the venv's own.
purelib=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
"$python" -c 'import site; print("\n".join(site.getsitepackages()))' \
  >"$purelib/_host_python.pth"
if [ -n "$wheels" ]; then
  # every staged wheel as staged (no resolution: the host's own packages stand for the rest), then the project
  "$venv/bin/python" -m pip install -q --no-index --no-deps --no-compile "$wheels"/*.whl
  # editable, built by the host's setuptools; where that cannot build it, the checkout on the path and the CLI
  if ! "$venv/bin/python" -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>"$venv/.editable.log"; then
    echo "note: no editable install ($(tail -1 "$venv/.editable.log")): the checkout goes on the path instead"
    pwd >"$purelib/_relax_platform_checkout.pth"
    printf '#!/bin/sh\nexec "%s" -m client.cli "$@"\n' "$(cd "$venv" && pwd)/bin/python" >"$venv/bin/relaxctl"
    chmod +x "$venv/bin/relaxctl"
  fi
else
  # a GPU host with an index: the project and the runtime extras but torch, which stays the host's
  "$venv/bin/python" -m pip install -q -c <(grep -v '^torch' constraints.txt) -e ".[megatron]" \
    "transformers>=4.45" "tokenizers>=0.19" "safetensors>=0.4" "tensorboard>=2.16"
fi
"$venv/bin/python" - <<'PY'
import torch, ray, megatron.core, fastapi, celery, sqlalchemy  # noqa: F401  what `make run` starts
cuda = torch.cuda.is_available()
print(f"{__import__('sys').prefix}: torch {torch.__version__} (CUDA {'yes: ' + torch.cuda.get_device_name(0) if cuda else 'no'}), ray {ray.__version__}")
PY
