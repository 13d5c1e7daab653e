# Issue 57 on a lent GPU machine, in calls that each carry a part or two (bench/README.md, "vLLM on the GPU"):
#   source bench/gpu_issue57.sh stage                  # keep what this call carried (/tmp/parts)
#   source bench/gpu_issue57.sh install serve [real]   # bench/gpu_serve_env.sh: the bundles whose parts all came
#   source bench/gpu_issue57.sh launch RUN             # detached: bench/gpu_pipeline.py --pipeline-only on RUN
#   source bench/gpu_issue57.sh compare RUN KINDS C    # detached: bench/serving_compare.py on the finished RUN
#   source bench/gpu_issue57.sh chain RUN KINDS C      # detached: launch, then each kind compared on its own (its
#                                                      # own json: a cut-off keeps the kinds done), 20 prompts, 1 round
#   source bench/gpu_issue57.sh peek                   # the logs so far, copied into $OUT
#   source bench/gpu_issue57.sh keep NAME PATH...      # PATHs packed into $OUT/NAME.tar.xz.NNN (15 MiB parts): what
#                                                      # a later machine can start from (answers, a draft)
# Work outlives the call (setsid) and writes under /tmp/g57; a later call on the same warm machine reads it.
verb=$1; shift
mkdir -p /tmp/parts /tmp/g57
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
    export PATH=/tmp/serve-env/bin:$PATH PYTHONUNBUFFERED=1 SPECOPS_SERVE_PYTHON=/tmp/serve-env/bin/python
    setsid nohup /tmp/serve-env/bin/python bench/serving_compare.py --workdir "/tmp/g57/$1" --run "$1" \
      --compare "$2" --concurrency "$3" --out "/tmp/g57/$1-compare.json" >"/tmp/g57/$1-compare.log" 2>&1 </dev/null &
    echo "comparing on $1 (pid $!)" ;;
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
  keep)
    name=$1; shift
    tar -cJf - "$@" | split -b 15M -d -a 3 - "$OUT/$name.tar.xz."
    ls -la "$OUT" ;;
esac
