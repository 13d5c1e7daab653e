"""The drafts evaluation scores: a training checkpoint, and the untrained draft beside it.

A checkpoint is speculators' own folder (<checkpoints>/<epoch>/ with config.json and
model.safetensors), which vLLM's speculators loader reads as it is. The untrained draft is
speculators' initialisation of the same config with the same d2t/t2d and the target's embedding
and LM head: the floor a trained draft must clear. It is saved (seeded, so always the same) to
<run>/evaluation/untrained/ so that vLLM can serve it too.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from specops.contract.errors import BadInput

if TYPE_CHECKING:
    import torch
    from speculators import SpeculatorModelConfig
    from speculators.models.eagle3 import Eagle3DraftModel

UNTRAINED = "untrained"
SEED = 0


def epoch_folders(checkpoints: Path) -> list[Path]:
    """Finished epochs' checkpoint folders, oldest first."""
    from specops.pipeline.training import command

    folders = [path for path in checkpoints.iterdir() if path.is_dir() and re.fullmatch(r"\d+", path.name)] \
        if checkpoints.is_dir() else []
    return sorted((path for path in folders if command.is_complete(path)), key=lambda path: int(path.name))


def choose_checkpoint(checkpoints: Path, which: str) -> Path:
    """best | last | an epoch number -> the checkpoint folder (bad input when it is not there)."""
    epochs = epoch_folders(checkpoints)
    if not epochs:
        raise BadInput(f"{checkpoints}: no finished checkpoint; run the train step first")
    if which == "last":
        return epochs[-1]
    if which == "best":
        best = checkpoints / "checkpoint_best"
        if best.exists():
            resolved = best.resolve()
            if (resolved / "config.json").is_file():
                return resolved
        return epochs[-1]
    if which.isdigit():
        folder = checkpoints / str(int(which))
        if folder in epochs:
            return folder
        raise BadInput(f"--checkpoint: epoch {which} has no finished checkpoint in {checkpoints} "
                       f"(there are {', '.join(path.name for path in epochs)})")
    raise BadInput(f"--checkpoint: expected best, last or an epoch number, got {which!r}")


def checkpoint_config(folder: Path, target: Path) -> SpeculatorModelConfig:
    """The checkpoint's speculators config, of its own kind (speculators' registry reads its
    `speculators_model_type`: an EAGLE-3 draft's Eagle3SpeculatorConfig, a DFlash draft's own, ...), its
    verifier pointed at `target` (the run's own model) when the path it recorded is gone: a workdir copied or
    moved elsewhere keeps its checkpoints, whose config names the target where it was trained, and speculators
    loads the verifier's embedding and LM head from that path."""
    from speculators import SpeculatorModelConfig

    config = SpeculatorModelConfig.from_pretrained(str(folder))
    verifier = config.speculators_config.verifier
    if verifier.name_or_path is None or not Path(verifier.name_or_path).exists():
        verifier.name_or_path = str(target)
    return config


def load_checkpoint(folder: Path, target: Path) -> Eagle3DraftModel:
    """speculators' Eagle3DraftModel from a checkpoint folder (see checkpoint_config)."""
    from speculators.models.eagle3 import Eagle3DraftModel

    return Eagle3DraftModel.from_pretrained(str(folder), config=checkpoint_config(folder, target))


def load_draft(folder: Path, target: Path, dtype: torch.dtype) -> Eagle3DraftModel:
    """The draft of a checkpoint folder for the run whose model is `target`, in `dtype`, eval mode."""
    return prepared(load_checkpoint(folder, target), dtype)


def prepared(model: Eagle3DraftModel, dtype: torch.dtype) -> Eagle3DraftModel:
    # The replay runs the layers directly with a causal sdpa (no flex-attention block masks).
    model.config.transformer_layer_config._attn_implementation = "sdpa"
    for layer in model.layers:
        layer.self_attn.config._attn_implementation = "sdpa"
    return model.to(dtype).eval()


def untrained_draft(trained_folder: Path, target: Path, out: Path) -> Path:
    """Build (once) the untrained draft for `trained_folder`'s config and mapping, of the trained draft's own kind
    (speculators' model registry picks the class from the config); its folder."""
    import torch
    from speculators import SpeculatorModel

    if (out / "model.safetensors").is_file() and (out / "config.json").is_file():
        return out
    config = checkpoint_config(trained_folder, target)
    model_class = SpeculatorModel.registered_model_class_from_config(config)
    trained = model_class.from_pretrained(str(trained_folder), config=config)
    torch.manual_seed(SEED)
    model = model_class(config)
    if getattr(trained, "t2d", None) is not None and getattr(trained, "d2t", None) is not None:
        model.load_vocab_mappings(trained.t2d.clone(), trained.d2t.clone())
    model._load_verifier_weights(overwrite_embed_tokens=True, overwrite_lm_head=True)
    model = model.to(next(trained.parameters()).dtype)
    from specops.host.atomic import replace_folder

    replace_folder(out, lambda staging: model.save_pretrained(str(staging)))
    return out
