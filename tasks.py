"""specops: Invoke tasks. Thin: parse flags, call remote/, render. `invoke --list` shows them all.

One explicit registry: every task group is imported by name, so a typo fails loudly. The task
modules import their heavy parts (fabric, rich, pydantic) inside the tasks, so listing is quick.
"""

import sys
from pathlib import Path

from invoke import Collection

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Invoke turns bytecode writing off unless --write-pyc is given, so every task would compile this
# checkout's modules again on each run. Turn it back on (git ignores __pycache__; the agent bundle and
# rsync leave it out), unless the user asked for none (PYTHONDONTWRITEBYTECODE or python -B: both set
# sys.flags.dont_write_bytecode at start-up, before Invoke runs).
if not sys.flags.dont_write_bytecode:
    sys.dont_write_bytecode = False

from remote.tasks import compat, core, doctor, jobs, patch, pipeline, plan, sync

ns = Collection()
for group in (core, sync, jobs, patch, doctor, compat, pipeline, plan):
    for task_object in group.TASKS:
        ns.add_task(task_object)
