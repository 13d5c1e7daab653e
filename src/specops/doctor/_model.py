"""Check 4: the run's settings against the target model's config.json and tokenizer files."""

from __future__ import annotations

import json
from pathlib import Path

from specops.doctor._report import Item
from specops.doctor.settings import RunSettings


def read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def text_config(config: dict) -> dict:
    """The language model's part: a multimodal wrapper's text_config, else the config itself."""
    inner = config.get("text_config")
    return {**config, **inner} if isinstance(inner, dict) else config


def default_layers(layers: int, server: bool) -> list[int]:
    # server extraction names the final output n (capture before layer n); old speculators n-1 (after)
    return [2, layers // 2, layers - 3, layers if server else layers - 1]


def check_model(settings: RunSettings, server: bool, speculators: str | None) -> tuple[list[Item], dict]:
    """Items, and facts for the other checks (architecture, layers, hidden size)."""
    if not settings.model_path:
        return [Item("model", "unknown", "model_path", "the run names no model", "set model: in the run config")], {}
    model = Path(settings.model_path)
    if not model.is_dir():
        return [Item("model", "unknown", str(model), "not a local directory: config not read (no hub access)",
                     "download the model to the host and point model_path at it")], {}
    config = read_json(model / "config.json")
    if config is None:
        return [Item("model", "error", str(model / "config.json"), "missing or not a JSON object",
                     "point model_path at a model folder with config.json")], {}
    items: list[Item] = []
    text = text_config(config)
    where = str(model / "config.json")
    if "text_config" in config:
        items.append(Item("model", "ok", where, "multimodal wrapper: layers, hidden size and vocab read from "
                          "text_config"))
        # how the installed worker reaches a wrapper's decoder is read from its source (_model_rules)
    layers, hidden, vocab = (text.get(k) for k in ("num_hidden_layers", "hidden_size", "vocab_size"))
    facts = {"architecture": (config.get("architectures") or [None])[0], "layers": layers, "hidden": hidden,
             "vocab": vocab, "model_type": text.get("model_type")}
    if not isinstance(layers, int):
        items.append(Item("model", "error", where, "no num_hidden_layers", "check the model's config.json"))
        return items, facts
    items.append(_layer_item(settings, layers, server, where))
    items.extend(_tokenizer_items(model, settings, server, speculators))
    facts["remote_tokenizer"] = remote_tokenizer(model)
    auto_map = config.get("auto_map")
    facts["remote_config"] = sorted(auto_map) if isinstance(auto_map, dict) else []  # Auto classes with own code
    facts["outer_model_type"] = config.get("model_type")
    if settings.draft_vocab_size is not None and isinstance(vocab, int):
        fits = settings.draft_vocab_size <= vocab
        items.append(Item("model", "ok" if fits else "error", "draft_vocab_size",
                          f"draft vocab {settings.draft_vocab_size} {'≤' if fits else '>'} target vocab {vocab}",
                          "" if fits else f"set draft_vocab_size ≤ {vocab}"))
    facts["layer_ids"] = settings.layer_ids or default_layers(layers, server)
    return items, facts


def _layer_item(settings: RunSettings, layers: int, server: bool, where: str) -> Item:
    convention = ("vLLM serving convention: id i is the input of layer i, id n the final output "
                  f"(valid 0..{layers})") if server else (
                  f"speculators in-process convention: id i is the output of layer i (valid 0..{layers - 1}); "
                  "one later than vLLM serving's")
    if settings.layer_ids is None:
        return Item("model", "ok", "layer_ids", f"default {default_layers(layers, server)}; {convention}")
    top = layers if server else layers - 1
    bad = [i for i in settings.layer_ids if i < 0 or i > top]
    if bad:
        return Item("model", "error", "layer_ids", f"{bad} out of range for {layers} layers; {convention}",
                    f"use ids in 0..{top}")
    return Item("model", "ok", "layer_ids", f"{settings.layer_ids} in range; {convention}")


def remote_tokenizer(model: Path) -> bool:
    auto_map = (read_json(model / "tokenizer_config.json") or {}).get("auto_map") or {}
    return "AutoTokenizer" in auto_map if isinstance(auto_map, dict) else bool(auto_map)


def _tokenizer_items(model: Path, settings: RunSettings, server: bool, speculators: str | None) -> list[Item]:
    items = []
    tokenizer_config = read_json(model / "tokenizer_config.json") or {}
    auto_map = tokenizer_config.get("auto_map") or {}
    where = str(model / "tokenizer_config.json")
    remote = "AutoTokenizer" in auto_map if isinstance(auto_map, dict) else bool(auto_map)
    if remote and not settings.trust_remote_code:
        items.append(Item("model", "error", where, "the tokenizer is remote code (auto_map) and the run does "
                          "not set trust_remote_code", "set trust_remote_code: true"))
    else:
        # whether the installed code passes trust_remote_code where it loads it: _model_rules, from source
        items.append(Item("model", "ok", where, "tokenizer needs remote code and the run trusts it" if remote
                          else "tokenizer needs no remote code"))
    has_template = "chat_template" in tokenizer_config or any(
        (model / name).exists() for name in ("chat_template.jinja", "chat_template.json"))
    items.append(Item("model", "ok" if has_template else "warn", where,
                      "chat template present" if has_template else "no chat template: conversations cannot "
                      "be rendered", "" if has_template else "add a chat_template to the tokenizer"))
    return items
