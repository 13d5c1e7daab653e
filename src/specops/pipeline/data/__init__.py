"""The data room: conversations in (JSONL or a hub dataset), the prepare step (tokenised rows, loss
masks, token frequencies), and the embedded tiny target with its chat data."""

from specops.pipeline.data.conversations import Conversation, Malformed, read_conversations
from specops.pipeline.data.preparation import load_tokenizer, prepare, tokenise_with_mask
from specops.pipeline.data.tiny import generate as generate_tiny

__all__ = ["Conversation", "Malformed", "generate_tiny", "load_tokenizer", "prepare", "read_conversations",
           "tokenise_with_mask"]
