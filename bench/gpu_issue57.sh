# Issue 57 on a lent GPU machine, in calls that each carry a part or two (bench/README.md, "vLLM on the GPU"):
#   source bench/gpu_issue57.sh stage                  # keep what this call carried (/tmp/parts)
#   source bench/gpu_issue57.sh install serve [real]   # bench/gpu_serve_env.sh: the bundles whose parts all came
#   source bench/gpu_issue57.sh suffix                 # arctic-inference's suffix tree into the serve env (its wheel
#                                                      # for the device's Python, from `setup-suffix.sh --wheel`)
#   source bench/gpu_issue57.sh launch RUN             # detached: bench/gpu_pipeline.py --pipeline-only on RUN
#   source bench/gpu_issue57.sh compare RUN KINDS C [CHECKPOINT]  # detached: serving_compare.py on the finished
#                                                      # RUN, each kind on its own
#   source bench/gpu_issue57.sh chain RUN KINDS C      # detached: launch, then each kind compared on its own (its
#                                                      # own json: a cut-off keeps the kinds done), 20 prompts, 1 round
#   source bench/gpu_issue57.sh peek                   # the logs so far, copied into $OUT
#   source bench/gpu_issue57.sh keep NAME PATH...      # PATHs packed into $OUT/NAME.tar.xz.NNN (15 MiB parts): what
#                                                      # a later machine can start from (answers, a draft)
#   source bench/gpu_issue57.sh restore RUN            # a run from what an earlier machine kept (.stage/kept: its
#                                                      # answers and trained draft), prepared: compare needs no pipeline
# Work outlives the call (setsid) and writes under /tmp/g57; a later call on the same warm machine reads it.
verb=$1; shift
export G57_ROOT G57_PYTHON
G57_ROOT=${G57_ROOT:-/tmp/g57} G57_PYTHON=${G57_PYTHON:-/tmp/serve-env/bin/python} G57_KEPT=${G57_KEPT:-.stage/kept}
mkdir -p /tmp/parts "$G57_ROOT"
cp -n .stage/*/*.tar.xz.* /tmp/parts/ 2>/dev/null
case $verb in
  stage) ls -la /tmp/parts ;;
  install) source bench/gpu_serve_env.sh "$@" ;;
  launch)
    export PATH=/tmp/serve-env/bin:$PATH PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
      NVSHMEM_DISABLE_NVLS=1 TRITON_CACHE_AUTOTUNING=1
    setsid nohup /tmp/serve-env/bin/python bench/gpu_pipeline.py --runs "$1" --workdir "/tmp/g57/$1" \
      --out "/tmp/g57/$1-out" --pipeline-only >"/tmp/g57/$1.log" 2>&1 </dev/null &
    echo "launched $1 (pid $!)" ;;
  compare)
    # RUN KINDS C [CHECKPOINT]: each kind on its own (its own json: a cut-off keeps the kinds done), 20 prompts, 1 round
    export PATH=$(dirname "$G57_PYTHON"):$PATH PYTHONUNBUFFERED=1 SPECOPS_SERVE_PYTHON=${SPECOPS_SERVE_PYTHON:-$G57_PYTHON}
    setsid nohup bash -c 'for kind in ${2//,/ }; do "$G57_PYTHON" bench/serving_compare.py --workdir "$G57_ROOT/$1" \
      --run "$1" --compare "$kind" --concurrency "$3" --prompts 20 --rounds 1 ${4:+--checkpoint "$4"} \
      --out "$G57_ROOT/$1-compare-$kind.json" >"$G57_ROOT/$1-compare-$kind.log" 2>&1; done' compare "$@" \
      </dev/null >/dev/null 2>&1 &
    echo "comparing $2 on $1 at $3 (pid $!)" ;;
  chain)
    export PATH=/tmp/serve-env/bin:$PATH PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
      NVSHMEM_DISABLE_NVLS=1 TRITON_CACHE_AUTOTUNING=1 SPECOPS_SERVE_PYTHON=/tmp/serve-env/bin/python
    setsid nohup bash -c '/tmp/serve-env/bin/python bench/gpu_pipeline.py --runs "$1" --workdir "/tmp/g57/$1" \
      --out "/tmp/g57/$1-out" --pipeline-only >"/tmp/g57/$1.log" 2>&1 && \
      for kind in ${2//,/ }; do /tmp/serve-env/bin/python bench/serving_compare.py --workdir "/tmp/g57/$1" \
      --run "$1" --compare "$kind" --concurrency "$3" --prompts 20 --rounds 1 --out "/tmp/g57/$1-compare-$kind.json" \
      >"/tmp/g57/$1-compare-$kind.log" 2>&1; done' chain "$@" </dev/null >/dev/null 2>&1 &
    echo "chained $1 then compare $2 at $3 (pid $!)" ;;
  peek)
    for log in /tmp/g57/*.log; do echo "== $log"; tail -n 25 "$log"; done
    for run in /tmp/g57/*/logs; do ls -t "$run" 2>/dev/null | head -3; done
    nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
    [ -n "${OUT:-}" ] && cp /tmp/g57/*.log /tmp/g57/*.json "$OUT"/ 2>/dev/null
    for out in /tmp/g57/*-out; do [ -d "$out" ] && mkdir -p "$OUT/$(basename "$out")" && cp "$out"/*.json "$OUT/$(basename "$out")"/ 2>/dev/null; done
    du -sh /tmp/g57/*/runs/*/* 2>/dev/null | sort -h | tail -12
    true ;;
  suffix)
    # .stage/suffix/arctic_inference-*.whl (scripts/setup-suffix.sh --wheel /path/to/python3.12 .stage/suffix): vLLM
    # imports its suffix tree from it (`evaluate --compare ...,suffix`); the tree runs on the CPU, numpy its one need
    whl=$(ls .stage/suffix/arctic_inference-*.whl /tmp/parts/arctic_inference-*.whl 2>/dev/null | head -1)
    [ -n "$whl" ] || { echo "suffix: no arctic_inference wheel carried (.stage/suffix)"; return 1; }
    cp -n "$whl" /tmp/parts/ 2>/dev/null
    "$G57_PYTHON" -m pip install -q --no-deps --no-index "$whl" && "$G57_PYTHON" -c \
      "from arctic_inference.suffix_decoding import SuffixDecodingCache; print('suffix: arctic-inference ok')" ;;
  restore)
    # the kept bundle (kept.tar.xz.NNN, checked against kept.sha256): the run folder's manifest (its regenerate
    # record only), regenerated/ (the answers) and checkpoints/ (a trained epoch and its acceptance). The prompts'
    # source file is built again from the data, as regenerate builds it; then `step prepare` (regenerate skips as
    # unchanged) writes the rows and the held-out prompts the comparison reads, and the draft goes in after it.
    run=$1; wd=$G57_ROOT/$1; dir=$G57_ROOT/$1/runs/$1; kept=$(cd "$G57_KEPT" && pwd)
    parts=()  # each part named in kept.sha256, from this call's carry or an earlier call's (/tmp/parts), checked
    while read -r digest name; do
      for at in "$kept/$name" "/tmp/parts/$name" missing; do
        [ "$at" = missing ] && { echo "restore: $name has not come (or fails its digest)"; return 1; }
        [ "$(sha256sum <"$at" 2>/dev/null | cut -d' ' -f1)" = "$digest" ] && { parts+=("$at"); break; }
      done
    done <"$kept/kept.sha256"
    rm -rf "$dir.kept" && mkdir -p "$dir.kept" && cat "${parts[@]}" | tar -xJf - -C "$dir.kept" || return 1
    mkdir -p "$dir" && mv "$dir.kept/manifest.json" "$dir.kept/regenerated" "$dir/"
    cp "runs/$run.yaml" "$wd/runs/"
    SPECOPS_WORKDIR=$wd PYTHONPATH=src "$G57_PYTHON" -c "import sys; from pathlib import Path
from specops.pipeline.run import Run
from specops.pipeline.regenerate.source import build_source
print('restore: source', build_source(Run(sys.argv[1], Path(sys.argv[2])))['conversations'], 'conversations')" \
      "$run" "$wd" || return 1
    (cd "$wd" && SPECOPS_WORKDIR=$wd PYTHONPATH=$OLDPWD/src "$G57_PYTHON" -m specops step prepare --run "$run" \
      >"$G57_ROOT/$run-prepare.json" 2>"$G57_ROOT/$run-prepare.log") || { tail -5 "$G57_ROOT/$run-prepare.log"; return 1; }
    # the draft after prepare: a step that runs sets aside what depends on it (its checkpoints included)
    mv "$dir.kept/checkpoints" "$dir/" && rmdir "$dir.kept"
    head -c 300 "$G57_ROOT/$run-prepare.json"; echo; ls "$dir/checkpoints" ;;
  keep)
    name=$1; shift
    tar -cJf - "$@" | split -b 15M -d -a 3 - "$OUT/$name.tar.xz."
    ls -la "$OUT" ;;
esac
