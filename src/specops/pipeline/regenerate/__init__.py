"""Step `regenerate`: the target answers the source conversations' prompts itself (before prepare).

One function a job: `regenerate` (this host answers, as many as prepare's N rows need), `regenerate_share`
(one host's share of a run across hosts), `require_whole` (the merged answers checked and recorded done);
the backend that answers is a `Backend`, picked by name in `backend_for`.
"""

from specops.pipeline.regenerate.backends import BACKENDS, Backend, HfBackend, VllmBackend, backend_for
from specops.pipeline.regenerate.shares import regenerate_share, require_whole
from specops.pipeline.regenerate.step import pipeline_step, regenerate

__all__ = ["BACKENDS", "Backend", "HfBackend", "VllmBackend", "backend_for", "pipeline_step", "regenerate",
           "regenerate_share", "require_whole"]
