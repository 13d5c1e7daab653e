"""Fidelity of hidden states without a forward of the whole target.

The final captured slice (id n: the residual stream before the final norm) goes through the
target's final norm and LM head in fp32; the argmax must agree with the target's own next-token
choice at every decidable position: one whose top-1 logit beats every other by more than the stored
dtype's rounding can move them (decidable_choices). In bf16 near-ties go either way between two
correct forwards (4 % of positions at 8B dimensions), so they prove nothing either way. Only the norm
and head tensors are read from the safetensors shards (a few GB of a 1T-parameter target), so the
check runs on a host that could never hold the whole model.

The target's choices come from one of two references:
- "hf":   a fresh transformers forward of the whole target (small targets only);
- "vllm": the vLLM server that produced the files, through its OpenAI completions endpoint with
          the prompt as token ids, max_tokens=1 and prompt_logprobs=1: per prompt position the
          logprob dict holds the top-1 token (rank 1), i.e. the choice after the prefix before it.

Anything this module cannot do faithfully (no safetensors, a quantized head, a norm it does not
know) raises Unsupported; the caller reports fidelity as "unknown" with the reason, never as ok.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Name prefixes of the language model inside the common wrappers (plain causal LM first).
_DECODER_PREFIXES = ("model.", "model.language_model.", "language_model.model.", "language_model.",
                     "model.text_model.", "text_model.", "transformer.")
_HEAD_NAMES = ("lm_head.weight", "language_model.lm_head.weight", "model.lm_head.weight")
_EPS_KEYS = ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", "norm_eps")
# RMSNorm variants computed as x * (1 + w) rather than x * w: projecting them as plain RMSNorm would
# be wrong, and a wrong check is worse than none.
_OFFSET_NORM_TYPES = ("gemma", "gemma2", "gemma3", "gemma3_text", "gemma3n", "qwen3_next")
_QUANT_SUFFIXES = ("weight_scale", "weight_scale_inv", "scales", "qweight", "weight_packed", "input_scale")
ROW_CHUNK = 1024  # rows projected at once: bounds the fp32 logits buffer (chunk x vocab)
VOCAB_CHUNK = 16384  # head rows widened to fp32 at once
HTTP_TIMEOUT_S = 120.0


class Unsupported(Exception):
    """Fidelity cannot be checked faithfully here: the reason goes into the report as "unknown"."""


# ---------------------------------------------------------------------------------------------
# Loading the final norm and LM head alone


def _weight_map(model_path: Path) -> dict[str, str]:
    """tensor name -> file name, from the shard index, else from the single model.safetensors."""
    index = model_path / "model.safetensors.index.json"
    if index.is_file():
        try:
            mapping = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as exc:
            raise Unsupported(f"{index.name}: no readable weight_map ({exc})") from None
        if not isinstance(mapping, dict) or not mapping:
            raise Unsupported(f"{index.name}: empty weight_map")
        return {str(name): str(file) for name, file in mapping.items()}
    single = model_path / "model.safetensors"
    if not single.is_file():
        raise Unsupported(f"{model_path}: no model.safetensors(.index.json); only safetensors checkpoints are read")
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as handle:
        return {name: single.name for name in handle.keys()}


def _first(names: tuple[str, ...], mapping: dict[str, str]) -> str | None:
    return next((name for name in names if name in mapping), None)


def _config(model_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    from specops.pipeline.run import text_config

    try:
        outer = json.loads((model_path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise Unsupported(f"{model_path / 'config.json'}: cannot read the target config ({exc})") from None
    return outer, text_config(outer)


def _tied(outer: dict[str, Any], inner: dict[str, Any]) -> bool | None:
    for config in (inner, outer):
        if isinstance(config.get("tie_word_embeddings"), bool):
            return config["tie_word_embeddings"]
    return None


@dataclass
class Projector:
    """The target's final norm (RMSNorm) and LM head, loaded alone; logits from captured states."""

    norm_weight: Any
    head_weight: Any
    eps: float
    source: dict[str, Any] = field(default_factory=dict)

    def to(self, device: Any) -> Projector:
        self.norm_weight = self.norm_weight.to(device)
        self.head_weight = self.head_weight.to(device)
        return self

    def logits(self, final: Any) -> Any:
        """fp32 logits [T, vocab] of pre-norm states [T, hidden], computed as the target does.

        Like transformers' RMSNorm: normalise in fp32, back to the states' dtype, times the weight;
        then the head in that dtype (matmuls accumulate in fp32). For fp32 states this is the
        target's own computation, bit for bit on the same device and thread count.
        """
        import torch

        dtype = final.dtype
        device = self.head_weight.device
        weight, head = self.norm_weight.to(dtype), self.head_weight.to(dtype)
        out = []
        with torch.inference_mode():
            for start in range(0, final.shape[0], ROW_CHUNK):
                rows = final[start:start + ROW_CHUNK].to(device)
                wide = rows.to(torch.float32)
                variance = wide.pow(2).mean(-1, keepdim=True)
                normed = weight * (wide * torch.rsqrt(variance + self.eps)).to(dtype)
                out.append(torch.nn.functional.linear(normed, head).float())
        return torch.cat(out)

    def choices(self, final: Any) -> Any:
        """Next-token argmax per position, on the CPU."""
        return self.logits(final).argmax(-1).cpu()

    def bounds(self, final: Any, roundings: float, unit: float | None = None) -> tuple[Any, Any]:
        """(fp32 logits [T, vocab], how far rounding can move each logit [T, vocab]) of at most
        ROW_CHUNK positions, on the head's device.

        The logits are computed in fp32 from the stored states, not in their dtype: the target's own
        rounding is what `spread` stands for. With u the stored dtype's unit roundoff, each element of
        the stored state is the target's up to a relative error of about `roundings` x u, independent
        in sign across elements; through the norm and head that moves logit i by a sum whose standard
        deviation is u * sqrt(sum_j (W_ij w_j h_j)^2) / rms(h). `spread` is `roundings` times that,
        plus u |z_i| for the rounding of the target's logits to its dtype. The head is widened to
        fp32 VOCAB_CHUNK rows at a time (a whole fp32 copy of a 160k x 7k head would be 4.7 GB).
        """
        import torch

        if unit is None:  # else the stored dtype's, given (fp8 files are read dequantised to fp32)
            unit = float(torch.finfo(final.dtype).eps) / 2
        device = self.head_weight.device
        weight = self.norm_weight.to(device).float()
        with torch.inference_mode():
            wide = final.to(device).float()
            normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
            logits, sigma = [], []
            for start in range(0, self.head_weight.shape[0], VOCAB_CHUNK):
                scaled = self.head_weight[start:start + VOCAB_CHUNK].float() * weight
                logits.append(torch.nn.functional.linear(normed, scaled))
                sigma.append(torch.nn.functional.linear(normed.square(), scaled.square()).sqrt())
            z = torch.cat(logits, -1)
            return z, unit * (roundings * torch.cat(sigma, -1) + z.abs())


def load_projector(model_path: str | Path, device: Any = "cpu") -> Projector:
    """Read only the final norm and LM head (or the tied embedding) of the target at model_path.

    model.safetensors.index.json's weight_map picks the shards; config.json (its text_config for
    multimodal wrappers) gives rms_norm_eps and tie_word_embeddings. `source` records the tensor
    names, their files and how many tensors were read (two).
    """
    import torch
    from safetensors import safe_open

    model_path = Path(model_path)
    outer, inner = _config(model_path)
    model_type = str(inner.get("model_type") or outer.get("model_type") or "")
    if model_type in _OFFSET_NORM_TYPES:
        raise Unsupported(f"model_type {model_type!r}: its final norm is not a plain RMSNorm (x * (1 + w))")
    eps_key = next((key for key in _EPS_KEYS if isinstance(inner.get(key), (int, float))), None)
    if eps_key is None:
        raise Unsupported(f"config.json: none of {', '.join(_EPS_KEYS)} is set; the final norm's epsilon is unknown")
    mapping = _weight_map(model_path)

    norm = _first(tuple(prefix + "norm.weight" for prefix in _DECODER_PREFIXES), mapping)
    if norm is None:
        raise Unsupported(f"no final norm tensor among {', '.join(p + 'norm.weight' for p in _DECODER_PREFIXES)}")
    if norm.removesuffix(".weight") + ".bias" in mapping:
        raise Unsupported(f"{norm}: the final norm has a bias (LayerNorm), not an RMSNorm")
    embed = _first(tuple(prefix + "embed_tokens.weight" for prefix in _DECODER_PREFIXES), mapping)
    head = _first(_HEAD_NAMES, mapping)
    tied = _tied(outer, inner)
    if tied is True or (head is None and tied is None):
        head, how = embed, "tied embedding"
    else:
        how = "lm_head"
    if head is None:
        raise Unsupported(f"no LM head tensor among {', '.join(_HEAD_NAMES)}"
                          + ("" if tied is False else " and no embed_tokens.weight to tie to"))
    stem = head.removesuffix(".weight")
    quantized = [stem + "." + suffix for suffix in _QUANT_SUFFIXES if stem + "." + suffix in mapping]
    if quantized:
        raise Unsupported(f"{head}: the LM head is quantized ({', '.join(quantized)}); not projected")

    tensors = {}
    for name in (norm, head):
        path = model_path / mapping[name]
        if not path.is_file():
            raise Unsupported(f"{name}: its shard {path} is missing")
        with safe_open(str(path), framework="pt") as handle:
            tensors[name] = handle.get_tensor(name)
    norm_weight, head_weight = tensors[norm], tensors[head]
    if not (norm_weight.is_floating_point() and head_weight.is_floating_point()):
        raise Unsupported(f"{head} / {norm}: not floating-point tensors ({head_weight.dtype}, {norm_weight.dtype})")
    if head_weight.dim() != 2 or norm_weight.shape != (head_weight.shape[1],):
        raise Unsupported(f"shapes do not fit: {norm} {tuple(norm_weight.shape)}, {head} {tuple(head_weight.shape)}")
    if head_weight.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        head_weight = head_weight.to(torch.bfloat16)  # fp8 stored unscaled: widen for the matmul
    source = {"norm": norm, "head": head, "head_kind": how, "eps": float(inner[eps_key]),
              "files": sorted({mapping[norm], mapping[head]}), "tensors_read": 2,
              "head_shape": list(head_weight.shape), "head_dtype": str(head_weight.dtype).removeprefix("torch.")}
    return Projector(norm_weight, head_weight, float(inner[eps_key]), source).to(device)


# ---------------------------------------------------------------------------------------------
# The target's own choices


class HfReference:
    """Next-token choices from a fresh transformers forward of the whole target."""

    name = "hf"

    def __init__(self, model: Any) -> None:
        self.model = model
        self.device = next(model.parameters()).device

    def choices(self, tokens: Any) -> Any:
        """[T] argmax after each prefix 0..i (the last one included)."""
        import torch

        with torch.inference_mode():
            logits = self.model(input_ids=tokens.unsqueeze(0).to(self.device), use_cache=False).logits[0]
        return logits.argmax(-1).cpu()


def served_models(endpoint: str, timeout_s: float = 10.0) -> list[str]:
    try:
        with urllib.request.urlopen(f"{endpoint.rstrip('/')}/models", timeout=timeout_s) as response:
            document = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise Unsupported(f"{endpoint}: the vLLM server does not answer /models ({exc})") from None
    models = [str(item.get("id")) for item in document.get("data", []) if isinstance(item, dict)]
    if not models:
        raise Unsupported(f"{endpoint}: the vLLM server serves no model")
    return models


def wait_for_staged_write(path: Path, timeout_s: float) -> bool:
    """Wait until the connector's writer releases `<path>.lock` (LOCK_EX while it writes); False on timeout.

    No lock file: the connector runs without locks, so wait for the file itself to appear.
    """
    import fcntl

    deadline = time.monotonic() + timeout_s
    lock = Path(f"{path}.lock")
    while not lock.exists():
        if path.exists() or time.monotonic() > deadline:
            return path.exists()
        time.sleep(0.02)
    with lock.open("rb") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.02)


STAGED_WRITE_WAIT_S = 60.0  # a staged write of one prompt's hidden states takes well under a second


class VllmReference:
    """Next-token choices from the vLLM server's prompt_logprobs (top-1 per prompt position)."""

    name = "vllm"

    def __init__(self, endpoint: str, model: str | None = None, timeout_s: float = HTTP_TIMEOUT_S,
                 staging: Path | None = None) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.model = model or served_models(self.endpoint)[0]
        self.timeout_s = timeout_s
        # The extraction server's connector writes each request's hidden states there, named after
        # the request id: ours are not wanted, and a long prompt's file is large.
        self.staging = staging

    def _discard_staged(self, document: Any) -> None:
        """Remove the hidden-state file the server's connector stages for our own request.

        The connector writes it AFTER the response returns, on a writer thread, holding an
        exclusive flock on `<file>.lock` from before the response until the write is done (its own
        client, load_hidden_states, waits the same way). So: wait for that lock, then remove both.
        The response names the file (kv_transfer_params.hidden_states_path).
        """
        if self.staging is None or not isinstance(document, dict):
            return
        staged = (document.get("kv_transfer_params") or {}).get("hidden_states_path")
        if isinstance(staged, str) and staged:
            path = Path(staged)
            if path.parent.resolve() != Path(self.staging).resolve():
                return  # not in the run's staging folder: not ours to remove
            wait_for_staged_write(path, min(self.timeout_s, STAGED_WRITE_WAIT_S))
            path.unlink(missing_ok=True)
            Path(f"{path}.lock").unlink(missing_ok=True)
            return
        request_id = document.get("id")  # a connector that does not say where: the file is named after the id
        if isinstance(request_id, str) and request_id:
            for leftover in Path(self.staging).glob(f"{request_id}*"):
                leftover.unlink(missing_ok=True)

    def prompt_logprobs(self, token_ids: list[int]) -> list[Any]:
        body = {"model": self.model, "prompt": token_ids, "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": 1}
        request = urllib.request.Request(f"{self.endpoint}/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                document = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise Unsupported(f"{self.endpoint}/completions: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise Unsupported(f"{self.endpoint}/completions: no answer ({exc})") from None
        self._discard_staged(document)
        try:
            entries = document["choices"][0]["prompt_logprobs"]
        except (KeyError, IndexError, TypeError):
            raise Unsupported(f"{self.endpoint}: the completion carries no prompt_logprobs") from None
        if not isinstance(entries, list) or len(entries) != len(token_ids):
            count = len(entries) if isinstance(entries, list) else "?"
            raise Unsupported(f"{self.endpoint}: prompt_logprobs has {count} entries for {len(token_ids)} tokens")
        return entries

    def choices(self, tokens: Any) -> Any:
        """[T-1] top-1 token after each prefix 0..i for i < T-1 (entry i+1 of prompt_logprobs)."""
        import torch

        entries = self.prompt_logprobs([int(t) for t in tokens.tolist()])
        picked = []
        for position, entry in enumerate(entries[1:], start=1):
            if not isinstance(entry, dict) or not entry:
                raise Unsupported(f"prompt_logprobs[{position}] is empty")
            top = [key for key, value in entry.items() if isinstance(value, dict) and value.get("rank") == 1]
            if not top:  # no ranks: the highest logprob
                top = [max(entry, key=lambda key: float(entry[key]["logprob"]))]
            picked.append(int(top[0]))
        return torch.tensor(picked, dtype=torch.long)


# ---------------------------------------------------------------------------------------------
# Agreement

# How many unit roundoffs of its dtype the stored state may sit from the target's own at an element,
# counted as standard deviations of the logits' movement: a forward batched or padded differently
# (another kernel, another reduction order) rounds differently at every layer, and the difference
# grows through the layers (bf16 at 8B dimensions on an H200: a few roundings); 4 standard deviations
# of that. A position whose top-1 logit beats every other by more than both can move is decidable.
ROUNDINGS = 24.0


@dataclass
class Agreement:
    """One row's comparison: all positions, the decidable ones, and where each agreed."""

    positions: int = 0
    agreed: int = 0            # the projection's argmax equals the reference's, at any position
    decidable: int = 0         # positions whose top-1 no rounding of the stored dtype can overturn
    decided_agreed: int = 0    # of those, where the reference chose the same token
    tolerances: list[float] = field(default_factory=list)  # the margin each position had to exceed
    dtype: str = ""            # the stored states' dtype, and its unit roundoff
    unit_roundoff: float = 0.0

    def add(self, other: Agreement) -> Agreement:
        return Agreement(self.positions + other.positions, self.agreed + other.agreed,
                         self.decidable + other.decidable, self.decided_agreed + other.decided_agreed,
                         self.tolerances + other.tolerances, other.dtype or self.dtype,
                         max(self.unit_roundoff, other.unit_roundoff))


def decidable_choices(projector: Projector, final: Any, roundings: float = ROUNDINGS,
                      unit: float | None = None) -> tuple[Any, Any, Any]:
    """(argmax [T], decidable [T] bool, tolerance [T]), on the CPU.

    Each logit is an interval z_i +- spread_i (Projector.bounds); a position is decidable when the
    top-1's lower end lies above every other token's upper end, so no rounding within the bound can
    change the target's choice there. The tolerance is the margin over the nearest rival that this
    asks for: the top-1's spread plus that rival's.
    """
    import torch

    tops, decided, tolerances = [], [], []
    for start in range(0, final.shape[0], ROW_CHUNK):
        logits, spread = projector.bounds(final[start:start + ROW_CHUNK], roundings, unit)
        top = logits.argmax(-1)[:, None]
        lower = (logits.gather(-1, top) - spread.gather(-1, top)).squeeze(-1)
        upper, rival = (logits + spread).scatter(-1, top, float("-inf")).max(-1)
        tops.append(top.squeeze(-1).cpu())
        decided.append((lower > upper).cpu())
        tolerances.append((spread.gather(-1, top).squeeze(-1) + spread.gather(-1, rival[:, None]).squeeze(-1)).cpu())
    return torch.cat(tops), torch.cat(decided), torch.cat(tolerances)


def agreement(projector: Projector, reference: Any, tokens: Any, hidden_states: Any,
              roundings: float = ROUNDINGS, stored: Any = None) -> Agreement:
    """The projected choices against the reference's, at every position and at the decidable ones.

    stored  the dtype the states were stored in when they come dequantised (fp8 files read as fp32): its unit
            roundoff decides which positions are decidable; default: the states' own dtype."""
    import torch

    final = hidden_states[:, -1]
    stored = stored or final.dtype
    kind = {"dtype": str(stored).removeprefix("torch."), "unit_roundoff": float(torch.finfo(stored).eps) / 2}
    projected, decidable, tolerance = decidable_choices(projector, final, roundings, kind["unit_roundoff"])
    wanted = reference.choices(tokens)
    compared = min(int(wanted.numel()), int(projected.numel()))
    if compared == 0:
        return Agreement(**kind)
    same = projected[:compared] == wanted[:compared]
    decided = decidable[:compared]
    return Agreement(compared, int(same.sum()), int(decided.sum()), int((same & decided).sum()),
                     [float(x) for x in tolerance[:compared].tolist()], **kind)
