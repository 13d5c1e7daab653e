"""specops: Invoke tasks. Thin: parse flags, call remote/, render. `invoke --list` shows them all."""

import importlib
import sys
from pathlib import Path

from invoke import Collection

sys.path.insert(0, str(Path(__file__).resolve().parent))

ns = Collection()
# Each module contributes a list TASKS; modules of features not yet landed are skipped.
TASK_MODULES = ("remote.tasks_core", "remote.tasks_sync", "remote.tasks_jobs", "remote.tasks_patch",
                "remote.tasks_doctor", "remote.tasks_pipeline", "remote.tasks_compat")
for module_name in TASK_MODULES:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            continue
        raise
    for task_object in module.TASKS:
        ns.add_task(task_object)
