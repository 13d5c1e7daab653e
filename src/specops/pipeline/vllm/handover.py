"""A kept server is left for the next run on the target; that run uses it and, once it needs what the
server holds, stops it as the server's own run would have.

`vllm.keep_server` keeps a run's last server up after its pipeline ended (vllm/keeper.py). Another run on
the same target uses it while it fits (vllm/sharing.py). When that run needs the port for a server of its
own (the gate's served check, the evaluation with its draft) or the GPUs (offline training: a served
target holds most of each GPU's memory), the kept server must go. Without this, such a run fails after
hours: its trainer runs out of GPU memory, or its evaluation is refused the port.

Only a kept server may be taken over (meta.keep, and nobody stopped it yet: its owner's pipeline has
ended), only of the same target and serve settings (sharing.RUN_WIDE), and only with its lease (waiting
while another run uses it). The stop is the owner's own `job stop`, run in the owner's workdir, so that
the owner's job records say it stopped. A server of a run that is still going is its run's: a run that
would need its port later is refused at launch (ports.check_before_run).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any

from specops.contract import commandline
from specops.contract.errors import CheckFailed
from specops.contract.progress import speaker
from specops.host.paths import workdir
from specops.pipeline.vllm import sharing
from specops.pipeline.vllm.captures import sweep_stopped
from specops.pipeline.vllm.ports import kept_for, port_holder

if TYPE_CHECKING:
    from specops.pipeline.run import Run

say = speaker("vllm")
STOP_GRACE_S = 20.0


def kept_by_another(run: Run, port: int) -> tuple[str, str, dict[str, Any]] | None:
    """(job, its workdir, its record): another run's kept server of this run's target and serve settings on
    `port`; None when the port holds anything else (that is refused or borrowed as before)."""
    holder = port_holder(port)
    if holder is None or holder.is_server_of(run.paths.name, str(workdir())):
        return None
    record = holder.server_record()
    if record is None or not kept_for(run, record):
        return None
    return str(holder.job), str(holder.workdir), record


def take_over(run: Run, port: int, why: str) -> dict[str, Any] | None:
    """Stop another run's kept server of this target on `port`, because this run needs `why`; what was
    stopped ({"job", "owner", "why"}), or None when no such server holds the port."""
    found = kept_by_another(run, port)
    if found is None:
        return None
    job, owner_workdir, record = found
    owner = (record.get("meta") or {}).get("keep", {}).get("owner_run") or record.get("run")
    sharing.hold(owner_workdir, job, f"run {run.paths.name} ({workdir()}), to stop it: {why}")
    try:
        say(f"stopping vLLM server job {job}, kept by run {owner} (workdir {owner_workdir}): {why}")
        env = {**os.environ, "SPECOPS_WORKDIR": owner_workdir}
        env.pop("SPECOPS_JOB_ID", None)  # the stop is the owner's, not a step of this run's job
        done = subprocess.run([sys.executable, "-m", "specops", *commandline.job_stop(job=job, grace=STOP_GRACE_S)],
                              cwd=owner_workdir, env=env, capture_output=True, text=True, timeout=120)
        if done.returncode == 0 and (swept := sweep_stopped(record)):
            say(swept)
    finally:
        sharing.release(owner_workdir, job)
    if done.returncode != 0:
        raise CheckFailed(f"could not stop vLLM server job {job} kept by run {owner} (workdir {owner_workdir}), "
                          f"which holds port {port}: {(done.stderr or done.stdout).strip()[-300:]}")
    return {"job": job, "owner": {"run": owner, "workdir": owner_workdir}, "why": why}
