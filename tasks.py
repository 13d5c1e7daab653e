"""specops: Invoke tasks. Thin: parse flags, call remote/, render. `invoke --list` shows them all.

One explicit registry: every task group is imported by name, so a typo fails loudly. The task
modules import their heavy parts (fabric, rich, pydantic) inside the tasks, so listing is quick.
"""

import sys
from pathlib import Path

from invoke import Collection

sys.path.insert(0, str(Path(__file__).resolve().parent))

from remote.tasks import compat, core, doctor, jobs, patch, pipeline, sync

ns = Collection()
for group in (core, sync, jobs, patch, doctor, compat, pipeline):
    for task_object in group.TASKS:
        ns.add_task(task_object)
