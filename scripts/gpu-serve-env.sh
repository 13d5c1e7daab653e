#!/usr/bin/env bash
# The serve env for a GPU host without internet, packed on a machine with internet (README: "A GPU host's serve
# env"). Downloads requirements/vllm-cuda.txt's wheels for the host's Python and platform (--no-deps: the file is
# the whole set), leaves out of vLLM's wheel what a Hopper GPU serving a bf16 model never loads (FlashAttention 2's
# kernels, the MoE extension, the vllm-rs binary, deep_gemm's builds for other Pythons: --keep-all keeps them), and
# packs the lot into parts of at most PART_MIB with a manifest of sha256s:
#   bash scripts/gpu-serve-env.sh OUT [--part-mib 60] [--python-version 3.12] [--keep-all] [-- EXTRA.whl ...]
# Then carry OUT/bundle/ to the host by any means, as many transfers as it takes (rsync --partial resumes a part),
# and on the host, with the python that holds its torch:
#   python -m specops wheelhouse install OUT/bundle --env ~/serve-env --python /path/to/python
# which checks every part, says which are missing or damaged (send those again), installs once all check, and prints
# the inventory line (envs: {serve: ~/serve-env/bin/python}). Idempotent: a finished download or pack is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu-serve-env.sh OUT [--part-mib N] [--python-version X.Y] [--keep-all] [-- EXTRA.whl ...]}
shift
part_mib=60; pyver=3.12; keep_all=0; extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --part-mib) part_mib=$2; shift 2 ;;
    --python-version) pyver=$2; shift 2 ;;
    --keep-all) keep_all=1; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "scripts/gpu-serve-env.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
python=${PYTHON:-.venv/bin/python}
[ -x "$python" ] || python=python3
mkdir -p "$out/wheels"
platforms=()
for tag in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_24 \
           manylinux_2_17 manylinux2014 manylinux1; do
  platforms+=(--platform "${tag}_x86_64")
done
stamp="$out/wheels/.downloaded"
want=$(sha256sum requirements/vllm-cuda.txt | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "gpu-serve-env: downloading requirements/vllm-cuda.txt for CPython $pyver (vLLM's wheel is ~300 MB)" >&2
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
    "${platforms[@]}" -d "$out/wheels" -r requirements/vllm-cuda.txt 2>&1 | { grep -v "is ignored" || true; }
  echo "$want" >"$stamp"
fi
for wheel in "${extra[@]}"; do cp -n "$wheel" "$out/wheels/"; done
if [ -f "$out/bundle/manifest.json" ]; then
  echo "gpu-serve-env: $out/bundle is packed already (remove it to pack again)" >&2
  exit 0
fi
drops=()
if [ "$keep_all" = 0 ]; then
  for member in "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" "vllm/_moe_C_stable_libtorch.abi3.so" "vllm/vllm-rs" \
                "vllm/third_party/deep_gemm/_C.cpython-31[0134]-*"; do
    drops+=(--drop "vllm:$member")
  done
fi
rm -rf "$out/bundle.partial"
echo "gpu-serve-env: packing $(ls "$out/wheels"/*.whl | wc -l) wheels into parts of $part_mib MiB (minutes: xz)" >&2
PYTHONPATH=src "$python" -m specops wheelhouse pack "$out/wheels" --out "$out/bundle.partial" --name serve \
  --part-mib "$part_mib" --fast "${drops[@]}" >"$out/pack.json"
mv "$out/bundle.partial" "$out/bundle"
"$python" -c "import json, sys; d = json.load(open(sys.argv[1])); print('gpu-serve-env: %d parts, %.1f MB, sha256 %s' \
% (len(d['parts']), d['bytes'] / 1e6, d['sha256'][:16]))" "$out/pack.json" >&2
