"""The validation room: whole hidden-state files with the right contents, and their fidelity to the
target (the final captured slice through the target's norm and head, against its own choices)."""

from specops.pipeline.validation.checks import (
    FIDELITY_THRESHOLD,
    MAX_LISTED,
    REFERENCES,
    check_fidelity,
    check_files,
    fidelity_indices,
    pipeline_step,
    validate,
)
from specops.pipeline.validation.fidelity import Unsupported, load_projector

__all__ = ["FIDELITY_THRESHOLD", "MAX_LISTED", "REFERENCES", "Unsupported", "check_fidelity", "check_files",
           "fidelity_indices", "load_projector", "pipeline_step", "validate"]
