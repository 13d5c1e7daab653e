"""One host's part of a role split (the run's `hosts: {serve: [...], train: [...]}`): a serve host holds the
run's vLLM server on all its GPUs with no trainer beside it (the states go to the shared folder, only those in
flight); a train host holds the trainer on all its GPUs, the prepared rows and the checkpoints."""

from __future__ import annotations

from typing import Any

from specops.planning import _sizes as sizes
from specops.planning._plan import DISK_SHARE, Plan, _gib, _server, _server_sizes, human

ROLES = ("serve", "train")


def role_fit(plan: Plan, role: str) -> dict[str, Any]:
    """{role, fits, problems, what the role holds here} for this host's plan."""
    target, run, host = plan.target, plan.run, plan.host
    usable = int(DISK_SHARE * host.disk_free_bytes)
    problems: list[str] = []
    if role == "serve":
        held: dict[str, Any] = {"holds": "the run's vLLM server, every GPU of the host"}
        if host.gpus and host.gpu_memory_bytes:
            server = _server(target, run, host, _server_sizes(target, run, host).tensor, run.gpu_memory_utilization)
            problems += server.pop("problems")
            held["server"] = server
        in_flight = plan.figures["hidden_states"]["in_flight_bytes"]
        held["shared_folder_bytes"] = in_flight  # what the server has written and the trainer not yet loaded
        return {"role": role, "fits": not problems, "problems": problems, **held}
    trainer = plan.figures["trainer"]
    held = {"holds": "speculators' trainer, every GPU of the host", "trainer_bytes": trainer["total_bytes"]}
    if host.gpus and host.gpu_memory_bytes and trainer["total_bytes"] > host.gpu_memory_bytes:
        problems.append(f"one training rank needs {_gib(trainer['total_bytes'])}, a GPU has "
                        f"{_gib(host.gpu_memory_bytes)}")
    disk = run.tokens * sizes.PREPARED_BYTES_PER_TOKEN + run.epochs * trainer["checkpoint_bytes"]
    held["disk_bytes"] = disk
    if disk > usable:
        problems.append(f"the prepared rows and {run.epochs} checkpoints need {human(disk)}, "
                        f"{human(host.disk_free_bytes)} free (up to {DISK_SHARE:.0%} used)")
    return {"role": role, "fits": not problems, "problems": problems, **held}
