"""The vLLM room: the extraction server's command (`vllm serve` argv and env), its readiness gate,
and the run's `vllm-server` job (found and reused, or launched; `start_job` for any other server
of the run, e.g. regenerate's and evaluate's). Other rooms use only this face."""

from specops.pipeline.vllm import baseline
from specops.pipeline.vllm.captures import Discarded
from specops.pipeline.vllm.command import (
    build_serve_command,
    needs_scale_out,
    serve_dtype,
    serve_env_version,
    serving_from,
    staging_dir,
)
from specops.pipeline.vllm.counters import request_counters
from specops.pipeline.vllm.generation import eagle3_config, generating_server, stop_generating_server
from specops.pipeline.vllm.handover import take_over
from specops.pipeline.vllm.job import (
    CPU_KVCACHE_GIB,
    SERVER_JOB,
    ServerJob,
    choose_serve_python,
    find_endpoint,
    launch_ahead,
    serve_env,
    start_job,
    start_server_job,
    stop_running,
)
from specops.pipeline.vllm.lifetime import end_of_run, server_loads, serving
from specops.pipeline.vllm.ports import check_before_run, live_server, port_holder, refuse_held_port, serves
from specops.pipeline.vllm.readiness import (
    group_pids,
    listening_inodes,
    port_owner,
    served_models,
    start_server,
    stop_server,
    wait_ready,
)
from specops.pipeline.vllm.sharing import release_all as release_servers
from specops.pipeline.vllm.speculative import draft_config, served_method, serving_config, speculative_config

__all__ = [
    "CPU_KVCACHE_GIB",
    "SERVER_JOB",
    "Discarded",
    "ServerJob",
    "baseline",
    "build_serve_command",
    "check_before_run",
    "choose_serve_python",
    "draft_config",
    "eagle3_config",
    "end_of_run",
    "find_endpoint",
    "generating_server",
    "group_pids",
    "launch_ahead",
    "listening_inodes",
    "live_server",
    "needs_scale_out",
    "port_holder",
    "port_owner",
    "refuse_held_port",
    "release_servers",
    "request_counters",
    "serve_dtype",
    "serve_env",
    "serve_env_version",
    "served_method",
    "served_models",
    "server_loads",
    "serves",
    "serving",
    "serving_config",
    "serving_from",
    "speculative_config",
    "staging_dir",
    "start_job",
    "start_server",
    "start_server_job",
    "stop_generating_server",
    "stop_running",
    "stop_server",
    "take_over",
    "wait_ready",
]
