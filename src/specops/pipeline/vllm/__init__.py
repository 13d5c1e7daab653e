"""The vLLM room: the extraction server's command (`vllm serve` argv and env), its readiness gate,
and the run's `vllm-server` job (found and reused, or launched). Other rooms use only this face."""

from specops.pipeline.vllm.command import build_serve_command, serve_dtype, serve_env_version, staging_dir
from specops.pipeline.vllm.job import (
    SERVER_JOB,
    ServerJob,
    choose_serve_python,
    find_endpoint,
    start_server_job,
    stop_running,
)
from specops.pipeline.vllm.readiness import (
    group_pids,
    listening_inodes,
    port_owner,
    served_models,
    start_server,
    stop_server,
    wait_ready,
)

__all__ = ["SERVER_JOB", "ServerJob", "build_serve_command", "choose_serve_python", "find_endpoint", "group_pids",
           "listening_inodes", "port_owner", "serve_dtype", "serve_env_version", "served_models", "staging_dir",
           "start_server", "start_server_job", "stop_running", "stop_server", "wait_ready"]
