"""What a run will cost before anything loads: a plan from the target's files, the data's tokens, the
run's settings and the host's GPUs and disk. Standard library only (the doctor reads it too).

    read_target(model_dir)                  -> TargetFacts   config.json + safetensors headers / index
    plan_loads(loads, load_rate(...), bytes) -> dict         the model loads, each with its estimated time
    make_plan(target, run, host, rates)     -> Plan          every figure, per mode; .to_dict() is `plan --json`
    role_fit(plan, role)                    -> dict          a role split's part of one host (serve | train)
    fits(plan) / plan.problems                               whether the run's own mode fits, and why not
    hidden_state_dtype, hidden_state_file_bytes, on_disk     the arithmetic the doctor's storage check shares
    resolve_sizes / default_sizes / size_problems            vLLM's tensor and data parallel sizes (ParallelSizes)
    row_ranges(count, parts)                                 rows cut into contiguous shares (hosts, processes)
    learning_advice(rows=, optimizer=, gpus=, hidden=, ...)  -> [Advice]  settings known to waste a training
"""

from specops.planning._advice import Advice, learning_advice
from specops.planning._loads import Load, LoadRate, load_rate, plan_loads
from specops.planning._options import make_plan
from specops.planning._parallel import (
    ModelShape,
    ParallelSizes,
    default_sizes,
    resolve_sizes,
    row_ranges,
    size_problems,
    tp_fits_heads,
)
from specops.planning._plan import (
    MODES,
    PLACEMENTS,
    HostFacts,
    Plan,
    Rate,
    Rates,
    RunFacts,
    fits,
    human,
)
from specops.planning._roles import ROLES, role_fit
from specops.planning._sizes import (
    GB,
    GIB,
    ONLINE_SAMPLES_IN_FLIGHT,
    DraftSize,
    draft_size,
    hidden_state_bytes_per_token,
    hidden_state_dtype,
    hidden_state_file_bytes,
    on_disk,
)
from specops.planning._target import (
    DTYPE_BYTES,
    TargetFacts,
    read_headers,
    read_target,
    safetensors_header,
    text_config,
)

__all__ = [
    "DTYPE_BYTES",
    "GB",
    "GIB",
    "MODES",
    "ONLINE_SAMPLES_IN_FLIGHT",
    "PLACEMENTS",
    "ROLES",
    "Advice",
    "DraftSize",
    "HostFacts",
    "Load",
    "LoadRate",
    "ModelShape",
    "ParallelSizes",
    "Plan",
    "Rate",
    "Rates",
    "RunFacts",
    "TargetFacts",
    "default_sizes",
    "draft_size",
    "fits",
    "hidden_state_bytes_per_token",
    "hidden_state_dtype",
    "hidden_state_file_bytes",
    "human",
    "learning_advice",
    "load_rate",
    "make_plan",
    "on_disk",
    "plan_loads",
    "read_headers",
    "read_target",
    "resolve_sizes",
    "role_fit",
    "row_ranges",
    "safetensors_header",
    "size_problems",
    "text_config",
    "tp_fits_heads",
]
