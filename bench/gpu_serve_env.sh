# Source from the repository root on a bare GPU device machine (bench/README.md, "vLLM on the GPU"):
#   source bench/gpu_serve_env.sh serve [real]     (the bundles to install; each must have all its parts by now)
# The bundles packed by scripts/gpu-serve-env.sh arrive in parts under .stage/NAME/ (carried a few parts a call,
# a machine kept warm between calls); each call gathers what has come into /tmp/bundles/NAME and, once a bundle's
# parts all check, installs it into one env over the image's torch: /tmp/serve-env (vLLM 0.26.0's CUDA build and
# its needs, speculators 0.9.0, specops' own needs; then the real model's packages). Until then it says which
# parts are still to come and returns 1.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
SERVE_ENV=${SERVE_ENV:-/tmp/serve-env}
missing=0
mkdir -p /tmp/parts
cp -n .stage/*/*.tar.xz.* /tmp/parts/ 2>/dev/null  # what this call carried, kept should the repo copy be replaced
for name in "$@"; do
  stage=.stage/$name
  mkdir -p "/tmp/bundles/$name"
  cp -n "$stage/manifest.json" "/tmp/bundles/$name/manifest.json"
  if PYTHONPATH=src python3 -m specops wheelhouse install "/tmp/bundles/$name" --from "$stage" \
       --from /tmp/parts --env "$SERVE_ENV" --python python3 >"/tmp/bundles/$name.json"; then
    echo "gpu_serve_env: $name installed: $(cat "/tmp/bundles/$name.json")"
  else
    echo "gpu_serve_env: $name: $(cat "/tmp/bundles/$name.json")"; missing=1
  fi
done
[ "$missing" = 0 ] || return 1
if [ ! -f /tmp/bundles/.patched ]; then
  mkdir -p /tmp/specops-setup
  SPECOPS_WORKDIR=/tmp/specops-setup PYTHONPATH=src "$SERVE_ENV/bin/python" -m specops patch apply \
    --set speculators-0.9.0-fused-loss --patches-dir patches >/tmp/specops-setup/patch.json \
    && touch /tmp/bundles/.patched || { cat /tmp/specops-setup/patch.json; return 1; }
fi
export PATH="$SERVE_ENV/bin:$PATH" TRITON_CACHE_AUTOTUNING=1
"$SERVE_ENV/bin/python" -c "import torch, vllm, transformers; from importlib.metadata import version; \
print('gpu_serve_env: torch', torch.__version__, 'vllm', vllm.__version__, 'transformers', transformers.__version__, \
'speculators', version('speculators'), 'gpus', torch.cuda.device_count())"
