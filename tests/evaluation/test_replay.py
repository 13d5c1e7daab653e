"""The hf replay drafts incrementally, on KV caches, and counts what the draft itself proposes.

The reference is speculators' own forward of the draft (its training-time test, teacher-forced):
in one pass it gives, at every verified length, the k tokens the draft proposes given that its
earlier proposals were right, which is all that acceptance depends on. Drafting round by round
over those proposals must give the replay's counts exactly, for the demo's trained and untrained
drafts and for 1, 3 and 5 speculative tokens.
"""

from __future__ import annotations

import pytest

from tests.evaluation.conftest import copy_of

PROMPTS = 8
MAX_TOKENS = 64


def reference_counts(draft, target, prompts, answers, k) -> dict:
    """Counts of greedy drafting with the proposals of speculators' Eagle3DraftModel.forward."""
    import torch

    from specops.pipeline.evaluation.replay import Counts

    counts = Counts(k)
    layers = list(draft.config.eagle_aux_hidden_state_layer_ids)
    for prompt, answer in zip(prompts, answers, strict=True):
        counts.generated += len(answer)
        if len(answer) < 2:
            continue
        sequence = prompt + answer
        with torch.no_grad():
            states = target(input_ids=torch.tensor([sequence[:-1]]), output_hidden_states=True).hidden_states
            steps = draft(hidden_states=torch.cat([states[layer] for layer in layers], dim=-1),
                          input_ids=torch.tensor([sequence[1:]]),
                          document_ids=torch.zeros((1, len(sequence) - 1), dtype=torch.long), ttt_steps=k)
        # proposals[i][j]: the j-th token drafted when the verified sequence ends at position i + 1
        proposals = torch.stack([step[0] + draft.d2t[step[0]] for step in steps], dim=1).tolist()
        verified, produced = len(prompt) + 1, 1
        while produced < len(answer):
            expected = answer[produced: produced + k]
            accepted = 0
            while accepted < len(expected) and proposals[verified - 2][accepted] == expected[accepted]:
                accepted += 1
            counts.add(k, accepted)
            produced += accepted + 1
            verified += accepted + 1
    return counts.as_dict()


@pytest.mark.slow
def test_the_replay_counts_what_speculators_own_forward_of_the_draft_proposes(evaluated, tmp_path,
                                                                               monkeypatch) -> None:
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel

    from specops.pipeline.data import load_tokenizer
    from specops.pipeline.evaluation.drafts import UNTRAINED, checkpoint_config
    from specops.pipeline.evaluation.replay import greedy_answers, replay
    from specops.pipeline.evaluation.step import heldout_token_ids
    from specops.pipeline.run import Run
    from specops.pipeline.target import load_target

    root = copy_of(evaluated, tmp_path / "w")
    monkeypatch.setenv("SPECOPS_WORKDIR", str(root))
    run = Run("tiny", root)
    prompts = heldout_token_ids(run, PROMPTS)
    target = load_target(run, torch.device("cpu"), torch.float32)
    tokenizer = load_tokenizer(run)
    answers = greedy_answers(target, prompts, MAX_TOKENS, tokenizer.eos_token_id, tokenizer.pad_token_id,
                             torch.device("cpu"))
    trained = run.paths.checkpoints / evaluated[1]["evaluation"]["report"]["checkpoint"]
    kept: dict = {"answers": dict(enumerate(answers)), "states": {}}  # as evaluate shares them between drafts
    for folder in (trained, run.paths.evaluation / UNTRAINED):
        config = checkpoint_config(folder, run.model_path)
        config.transformer_layer_config._attn_implementation = "sdpa"  # as the demo trains it
        draft = Eagle3DraftModel.from_pretrained(str(folder), config=config).float().eval()
        for k in (1, 3, 5):
            counts = replay(run, folder, prompts, k, MAX_TOKENS, target=target, **kept)
            assert counts == reference_counts(draft, target, prompts, answers, k), (folder.name, k)
            assert counts["num_drafts"] > 0 and counts["num_draft_tokens"] == k * counts["num_drafts"]
        if folder == trained:
            assert counts["num_accepted_tokens"] > counts["num_drafts"] // 2  # k=5: the trained draft is taken
