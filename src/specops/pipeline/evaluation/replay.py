"""The `hf` backend of evaluate: greedy EAGLE-3 drafting replayed with the draft and the target.

What vLLM does when it serves the draft as the target's speculator, in plain transformers.
Greedy decoding of the target never depends on the drafts, so the target's own continuation is
computed once per evaluation (one batched generate on its KV cache, whatever the number of drafts
scored), and one forward over prompt + continuation gives its auxiliary hidden states, also kept
for every draft of the evaluation.

The draft reads position i as (embedding of token i+1, fc(auxiliary states at i)). With the first
V tokens verified, vLLM has run the draft over positions 0..V-2 (its KV cache holds them) and the
output at V-2 proposes the first token; each of the k-1 further steps feeds one position (the
embedding of the proposal, the draft's pre-norm output) and proposes the next. The target accepts
the longest prefix that equals its own continuation, the speculative positions leave the cache,
and V grows by accepted + 1. The draft's keys, values and outputs at a verified position depend
only on the verified positions before it, and the verified tokens are the target's continuation,
known here in advance: so one causal pass of the draft over the whole sequence fills its KV cache
with every verified position at once (what vLLM's cache holds at each round is a prefix of it),
and a round costs only its k-1 speculative steps, each one query attending to the verified prefix
(an attention mask) and to the round's earlier speculative positions. Nothing is recomputed;
the work per drafted token is one draft position plus attention over the sequence.

The prompts of a batch draft together, as a server batches requests (one cache, rows padded to one
width, each row at its own verified length). Counted like vLLM's spec-decode counters: drafts,
drafted tokens, accepted tokens, accepted per position.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    import torch
    from speculators.models.eagle3 import Eagle3DraftModel

    from specops.pipeline.run import DraftCounts, Run

# the target's auxiliary hidden states by (layer ids, token ids): one evaluation's drafts share them
States = dict[tuple[tuple[int, ...], tuple[int, ...]], "torch.Tensor"]

ANSWER_BATCH = 32  # held-out prompts answered by the target, then drafted, together


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

    def add_tally(self, drafted: int, tally: list[int]) -> None:
        """tally[j]: drafts that had j tokens accepted."""
        for accepted, drafts in enumerate(tally):
            for _ in range(drafts):
                self.add(drafted, accepted)

    def as_dict(self) -> DraftCounts:
        return {"num_drafts": self.drafts, "num_draft_tokens": self.draft_tokens,
                "num_accepted_tokens": self.accepted, "accepted_per_position": list(self.per_position),
                "generated_tokens": self.generated}


def greedy_answers(target: torch.nn.Module, prompts: list[list[int]], max_tokens: int, eos: int | None, pad: int | None,
                   device: torch.device) -> list[list[int]]:
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


class DraftCache:
    """The draft's keys and values for rows drafting together, preallocated ([rows, kv heads, slots, head
    dim] a layer): the draft's attention layers call update() as they would on a transformers cache. The
    verified positions fill it once; each round's speculative slots follow them and are given back after
    the round (rewind), so no step copies what the cache holds."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.keys: list[Any] = []
        self.values: list[Any] = []
        self.filled: list[int] = []

    def update(self, key: Any, value: Any, layer_idx: int, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        if layer_idx == len(self.keys):
            rows, heads, _, _ = key.shape
            self.keys.append(key.new_zeros((rows, heads, self.slots, key.shape[3])))
            self.values.append(value.new_zeros((rows, heads, self.slots, value.shape[3])))
            self.filled.append(0)
        start = self.filled[layer_idx]
        end = start + key.shape[2]
        self.keys[layer_idx][:, :, start:end] = key
        self.values[layer_idx][:, :, start:end] = value
        self.filled[layer_idx] = end
        return self.keys[layer_idx][:, :, :end], self.values[layer_idx][:, :, :end]

    def rewind(self, slots: int) -> None:
        self.filled = [filled - slots for filled in self.filled]


class Replay:
    def __init__(self, target: torch.nn.Module, draft: Eagle3DraftModel, k: int, device: torch.device,
                 states: States | None = None) -> None:
        import torch

        self.torch = torch
        self.target = target
        self.draft = draft
        self.k = k
        self.device = device
        self.aux_ids = list(draft.config.eagle_aux_hidden_state_layer_ids)
        self.dtype = draft.fc.weight.dtype
        self.window = getattr(draft, "sliding_window", None)
        self.sliding_layers = set(getattr(draft, "sliding_window_indices", None) or [])
        self.states = {} if states is None else states  # the target's auxiliary states by sequence

    def aux_states(self, tokens: list[int]) -> torch.Tensor:
        """[len(tokens), n_aux * hidden]: the hidden states entering the draft's auxiliary layers."""
        torch = self.torch
        key = (tuple(self.aux_ids), tuple(tokens))
        if key not in self.states:
            with torch.no_grad():
                out = self.target(input_ids=torch.tensor([tokens], device=self.device), output_hidden_states=True)
            self.states[key] = torch.cat([out.hidden_states[layer][0] for layer in self.aux_ids], dim=-1)
        return self.states[key].to(self.dtype)

    def _fc(self, aux: torch.Tensor) -> torch.Tensor:
        """The draft's reading of the target's auxiliary states, its optional norms included (vLLM
        applies them too)."""
        draft = self.draft
        if getattr(draft, "input_norm", None) is not None:
            aux = draft.input_norm(aux)
        if getattr(draft, "fc_norm", None) is not None:
            chunks = aux.chunk(len(draft.fc_norm), dim=-1)
            aux = self.torch.cat([norm(chunk) for norm, chunk in zip(draft.fc_norm, chunks, strict=True)], dim=-1)
        return draft.fc(aux)

    def _inputs(self, prompt: list[int], answer: list[int]) -> torch.Tensor:
        """[len(sequence) - 1, 2 * hidden]: position i reads token i+1 and the target's state at i."""
        sequence = prompt + answer
        aux = self._fc(self.aux_states(sequence[:-1]))
        embeds = self.draft.embed_tokens(self.torch.tensor(sequence, device=self.device)).to(self.dtype)
        return self.torch.cat([embeds[1:], aux], dim=-1)

    def _layers(self, states: torch.Tensor, positions: torch.Tensor, cache: DraftCache,
                masks: tuple[torch.Tensor | None, torch.Tensor | None]) -> torch.Tensor:
        rotary = self.draft.rotary_emb(states, positions)
        for index, layer in enumerate(self.draft.layers):
            states = layer(states, attention_mask=masks[1] if index in self.sliding_layers else masks[0],
                           position_ids=positions, past_key_values=cache, position_embeddings=rotary)
        return states

    def _head(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the proposed target token ids, the state fed to the next position) from layer outputs."""
        draft = self.draft
        if draft.config.norm_output:
            out = draft.norm(out)
            logits = draft.lm_head(out)
        else:
            logits = draft.lm_head(draft.norm(out))
        draft_ids = self.torch.argmax(logits, dim=-1)
        tokens = draft_ids + draft.d2t[draft_ids] if draft.d2t is not None else draft_ids
        return tokens, out

    def _window(self, allowed: torch.Tensor, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor | None:
        """`allowed` [rows, 1, queries, keys] narrowed to the sliding window (None without one)."""
        if not self.sliding_layers:
            return None
        return allowed & (query[:, None, :, None] - keys[:, None, None, :] < self.window)

    def score(self, prompts: list[list[int]], answers: list[list[int]], counts: Counts) -> None:
        """Counts the drafting of the prompts whose greedy answers by the target are `answers`; the
        prompts draft together, round by round, as a server batches its requests."""
        torch = self.torch
        device = self.device
        pairs = [(prompt, answer) for prompt, answer in zip(prompts, answers, strict=True) if len(answer) >= 2]
        if not pairs:
            return
        with torch.no_grad():
            inputs = torch.nn.utils.rnn.pad_sequence([self._inputs(*pair) for pair in pairs], batch_first=True)
            rows, width = inputs.shape[:2]
            slots = torch.arange(width, device=device)
            positions = slots[None, :].expand(rows, -1)
            cache = DraftCache(width + self.k - 1)
            # Every verified position at once: causal, so right padding never reaches a real position.
            causal = slots[None, None, None, :] <= slots[None, None, :, None]
            prefill = self._layers(inputs, positions, cache,
                                   (None, self._window(causal.expand(rows, -1, -1, -1), positions, positions)))
            expected = torch.nn.utils.rnn.pad_sequence(
                [torch.tensor(answer, device=device) for _, answer in pairs], batch_first=True, padding_value=-1)
            answer_lengths = torch.tensor([len(answer) for _, answer in pairs], device=device)
            verified = torch.tensor([len(prompt) + 1 for prompt, _ in pairs], device=device)
            produced = torch.ones(rows, dtype=torch.long, device=device)
            ahead = torch.arange(self.k, device=device)
            tally = torch.zeros(self.k + 1, dtype=torch.long, device=device)  # drafts by tokens accepted
            every = torch.arange(rows, device=device)
            active = produced < answer_lengths
            speculative = torch.ones((rows, self.k), dtype=torch.bool, device=device)
            while bool(active.any()):
                last = torch.minimum(verified - 2, torch.tensor(width - 1, device=device))
                tokens, fed = self._head(prefill[every, last])
                proposed = [tokens]
                prefix = slots[None, :] <= last[:, None]  # the row's verified positions, in its cache
                for step in range(1, self.k):
                    state = torch.cat([self.draft.embed_tokens(tokens).to(self.dtype), fed], dim=-1)[:, None, :]
                    query = (last + step)[:, None]
                    allowed = torch.cat([prefix, speculative[:, :step]], dim=1)[:, None, None, :]
                    key_positions = (torch.cat([positions, last[:, None] + torch.arange(1, step + 1, device=device)],
                                               dim=1) if self.sliding_layers else None)
                    out = self._layers(state, query, cache, (allowed, self._window(allowed, query, key_positions)))
                    tokens, fed = self._head(out[:, 0])
                    proposed.append(tokens)
                cache.rewind(self.k - 1)
                at = produced[:, None] + ahead[None, :]
                wanted = torch.gather(expected, 1, at.clamp(max=expected.shape[1] - 1))
                matches = (torch.stack(proposed, dim=1) == wanted) & (at < answer_lengths[:, None])
                accepted = matches.long().cumprod(dim=1).sum(dim=1)
                tally += torch.bincount(accepted[active], minlength=self.k + 1)
                produced = torch.where(active, produced + accepted + 1, produced)
                verified = torch.where(active, verified + accepted + 1, verified)
                active = produced < answer_lengths
            counts.add_tally(self.k, tally.tolist())


def replay(run: Run, draft_folder: Path, prompts: list[list[int]], k: int, max_tokens: int,
           target: torch.nn.Module | None = None, answers: dict[int, list[int]] | None = None,
           states: States | None = None) -> DraftCounts:
    """Counts of greedy EAGLE-3 drafting of `draft_folder` on the prompts (token ids).

    target: the run's target model (loaded here when None: on the GPU in bf16 when there is one,
    else on the CPU in fp32; the run's dtype setting decides as for every other step); the draft
    computes on its device and in its dtype. answers: the target's greedy answers by prompt index,
    filled as they are generated; pass the same dict for every draft of one evaluation (the
    answers do not depend on the draft). states: likewise the target's auxiliary hidden states of
    each sequence (on the target's device: about n_aux * hidden * 4 bytes a token in fp32)."""
    from specops.pipeline.data import load_tokenizer
    from specops.pipeline.evaluation.drafts import load_draft
    from specops.pipeline.target import choose_device, load_target

    if target is None:
        target = load_target(run, *choose_device(run.config.dtype))
    parameter = next(target.parameters())
    device = parameter.device  # the draft and every input go where the target is
    draft = load_draft(draft_folder, run.model_path, parameter.dtype).to(device)
    tokenizer = load_tokenizer(run)
    eos = tokenizer.eos_token_id
    counts = Counts(k)
    replayer = Replay(target, draft, k, device, states)
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
