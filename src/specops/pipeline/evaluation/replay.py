"""The `hf` backend of evaluate: greedy EAGLE-3 drafting replayed with the draft and the target.

What vLLM does when it serves the draft as the target's speculator, in plain transformers:
greedy decoding of the target never depends on the drafts, so the target's own continuation is
computed once per evaluation (one batched generate, whatever the number of drafts scored), and one
forward over prompt + continuation gives its auxiliary hidden states. Then, round by round as vLLM
drafts: with the first L tokens verified, the draft reads
position i as (embedding of token i+1, fc(auxiliary states at i)) for i < L-1 and proposes k
tokens, each step feeding its own pre-norm output and the embedding of its proposal to the next
position; the target accepts the longest prefix that equals its own continuation, and the
verified length grows by accepted + 1 (the target's own next token). A 1-layer draft's keys and
values at a position depend only on that position's input, so recomputing the sequence each
step is what vLLM's KV cache holds. Counted like vLLM's spec-decode counters: drafts, drafted
tokens, accepted tokens, accepted per position.
"""

from __future__ import annotations

from typing import Any

ANSWER_BATCH = 16  # held-out prompts answered by the target, then drafted, together


class Counts:
    def __init__(self, k: int) -> None:
        self.k = k
        self.drafts = 0
        self.draft_tokens = 0
        self.accepted = 0
        self.per_position = [0] * k
        self.generated = 0

    def add(self, drafted: int, accepted: int) -> None:
        self.drafts += 1
        self.draft_tokens += drafted
        self.accepted += accepted
        for position in range(accepted):
            self.per_position[position] += 1

    def as_dict(self) -> dict[str, Any]:
        return {"num_drafts": self.drafts, "num_draft_tokens": self.draft_tokens,
                "num_accepted_tokens": self.accepted, "accepted_per_position": list(self.per_position),
                "generated_tokens": self.generated}


def greedy_answers(target: Any, prompts: list[list[int]], max_tokens: int, eos: int | None, pad: int | None,
                   device: Any) -> list[list[int]]:
    """The target's greedy answers (the end-of-turn token included when it stops), one batch.

    Left padding, as the regenerate step batches: every prompt ends at the same column and
    generate derives the positions from the mask, so each row is its own greedy decode."""
    import torch

    from specops.pipeline.target import left_padded

    pad = pad if pad is not None else (eos if eos is not None else 0)
    ids, mask = left_padded(prompts, pad)
    width = ids.shape[1]
    with torch.no_grad():
        out = target.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=False,
                              max_new_tokens=max_tokens, eos_token_id=eos, pad_token_id=pad)
    answers = []
    for tokens in out[:, width:].tolist():
        answers.append(tokens[: tokens.index(eos) + 1] if eos is not None and eos in tokens else tokens)
    return answers


class Replay:
    def __init__(self, target: Any, draft: Any, k: int, device: Any) -> None:
        import torch

        self.torch = torch
        self.target = target
        self.draft = draft
        self.k = k
        self.device = device
        self.aux_ids = list(draft.config.eagle_aux_hidden_state_layer_ids)
        self.dtype = draft.fc.weight.dtype

    def aux_states(self, tokens: list[int]) -> Any:
        """[len(tokens), n_aux * hidden]: the hidden states entering the draft's auxiliary layers."""
        torch = self.torch
        with torch.no_grad():
            out = self.target(input_ids=torch.tensor([tokens], device=self.device), output_hidden_states=True)
        return torch.cat([out.hidden_states[layer][0] for layer in self.aux_ids], dim=-1).to(self.dtype)

    def _draft_forward(self, inputs: list[Any]) -> tuple[Any, Any]:
        """(logits over the draft vocabulary, pre-norm output) at the last position of each row.

        inputs: per row, [positions, embedding + fc(hidden)]; the rows are right-padded to one
        width: attention is causal, so a row's positions never see the padding after them."""
        torch = self.torch
        draft = self.draft
        lengths = torch.tensor([len(row) for row in inputs], device=self.device)
        states = torch.nn.utils.rnn.pad_sequence(inputs, batch_first=True)
        positions = torch.arange(states.shape[1], device=self.device).unsqueeze(0)
        rotary = draft.rotary_emb(states, positions)
        for layer in draft.layers:
            states = layer(states, attention_mask=None, position_ids=positions, past_key_values=None,
                           cache_position=positions[0], position_embeddings=rotary)
        last = states[torch.arange(len(inputs), device=self.device), lengths - 1]
        if draft.config.norm_output:
            normed = draft.norm(last)
            return draft.lm_head(normed), normed
        return draft.lm_head(draft.norm(last)), last

    def _row(self, prompt: list[int], answer: list[int]) -> _Row:
        torch = self.torch
        draft = self.draft
        sequence = prompt + answer
        aux = draft.fc(self.aux_states(sequence[:-1]))
        embeds = draft.embed_tokens(torch.tensor(sequence, device=self.device)).to(self.dtype)
        # Position i reads token i+1 and the target's state at i.
        return _Row(answer, torch.cat([embeds[1:], aux], dim=-1), verified=len(prompt) + 1)

    def score(self, prompts: list[list[int]], answers: list[list[int]], counts: Counts) -> None:
        """Counts the drafting of the prompts whose greedy answers by the target are `answers`; the
        prompts draft together, round by round, as a server batches its requests."""
        torch = self.torch
        draft = self.draft
        d2t = draft.d2t
        with torch.no_grad():
            rows = [self._row(prompt, answer) for prompt, answer in zip(prompts, answers, strict=True)
                    if len(answer) >= 2]
            while rows:
                inputs = [row.inputs[: row.verified - 1] for row in rows]
                proposals: list[list[int]] = [[] for _ in rows]
                for _step in range(self.k):
                    logits, pre_norm = self._draft_forward(inputs)
                    draft_ids = torch.argmax(logits, dim=-1)
                    tokens = draft_ids + d2t[draft_ids] if d2t is not None else draft_ids
                    embeds = draft.embed_tokens(tokens).to(self.dtype)
                    fed = torch.cat([embeds, pre_norm], dim=-1)
                    for index, token in enumerate(tokens.tolist()):
                        proposals[index].append(token)
                        inputs[index] = torch.cat([inputs[index], fed[index: index + 1]], dim=0)
                for row, proposed in zip(rows, proposals, strict=True):
                    row.accept(proposed, self.k, counts)
                rows = [row for row in rows if row.produced < len(row.answer)]


class _Row:
    """One prompt being drafted: its answer, its inputs at every verified position, how far it got."""

    def __init__(self, answer: list[int], inputs: Any, verified: int) -> None:
        self.answer = answer
        self.inputs = inputs
        self.verified = verified  # the prefill's own token included
        self.produced = 1

    def accept(self, proposed: list[int], k: int, counts: Counts) -> None:
        expected = self.answer[self.produced: self.produced + k]
        accepted = 0
        while accepted < len(expected) and proposed[accepted] == expected[accepted]:
            accepted += 1
        counts.add(k, accepted)
        self.produced += accepted + 1
        self.verified += accepted + 1


def replay(run: Any, draft_folder: Any, prompts: list[list[int]], k: int, max_tokens: int,
           target: Any = None, answers: dict[int, list[int]] | None = None) -> dict[str, Any]:
    """Counts of greedy EAGLE-3 drafting of `draft_folder` on the prompts (token ids).

    answers: the target's greedy answers by prompt index, filled as they are generated; pass the
    same dict for every draft of one evaluation (the answers do not depend on the draft)."""
    import torch

    from specops.pipeline.data import load_tokenizer
    from specops.pipeline.evaluation.drafts import load_draft
    from specops.pipeline.target import load_target

    if target is None:
        target = load_target(run, torch.device("cuda" if torch.cuda.is_available() else "cpu"), torch.float32)
    device = next(target.parameters()).device  # the draft and every input go where the target is
    draft = load_draft(draft_folder, run.model_path, torch.float32).to(device)
    tokenizer = load_tokenizer(run)
    eos = tokenizer.eos_token_id
    counts = Counts(k)
    replayer = Replay(target, draft, k, device)
    answers = {} if answers is None else answers
    missing = [index for index in range(len(prompts)) if index not in answers]
    for start in range(0, len(missing), ANSWER_BATCH):
        batch = missing[start: start + ANSWER_BATCH]
        for index, answer in zip(batch, greedy_answers(target, [prompts[i] for i in batch], max_tokens, eos,
                                                               tokenizer.pad_token_id, device), strict=True):
            answers[index] = answer
    for start in range(0, len(prompts), ANSWER_BATCH):
        batch = range(start, min(start + ANSWER_BATCH, len(prompts)))
        counts.generated += sum(len(answers[index]) for index in batch)
        replayer.score([prompts[index] for index in batch], [answers[index] for index in batch], counts)
    return counts.as_dict()
