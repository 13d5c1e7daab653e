# Source from the repository root on a bare device machine (bench/README.md, "On the H200"):
#   source bench/device_setup.sh
# Installs the carried wheels (.whl/: speculators 0.9.0, hs-connectors and the runtime needs the
# image lacks) into /tmp/site, applies the fused-loss patch set (torch 2.11 + torch.compile), and
# puts a tmux unpacked from .tools/*.deb on PATH when the image has none (specops runs jobs in tmux).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || return 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast stays off
mkdir -p /tmp/specops-setup
SPECOPS_WORKDIR=/tmp/specops-setup PYTHONPATH=/tmp/site:src python3 -m specops patch apply \
  --set speculators-0.9.0-fused-loss --patches-dir patches >/tmp/specops-setup/patch.json \
  || { cat /tmp/specops-setup/patch.json; return 1; }
if ! command -v tmux >/dev/null; then
  mkdir -p /tmp/tmuxroot/bin
  for deb in .tools/*.deb; do dpkg -x "$deb" /tmp/tmuxroot; done
  printf '#!/bin/sh\nLD_LIBRARY_PATH=/tmp/tmuxroot/usr/lib/x86_64-linux-gnu exec /tmp/tmuxroot/usr/bin/tmux "$@"\n' \
    >/tmp/tmuxroot/bin/tmux
  chmod +x /tmp/tmuxroot/bin/tmux
  export PATH=/tmp/tmuxroot/bin:$PATH
  echo "device_setup: tmux from .tools ($(tmux -V))"
fi
export TRITON_CACHE_AUTOTUNING=1  # the fused loss's autotune results carry over between training runs
python3 -c "import torch, transformers, datasets; from importlib.metadata import version; \
print('device_setup: torch', torch.__version__, 'transformers', transformers.__version__, \
'speculators', version('speculators'), 'gpus', torch.cuda.device_count())" || true
