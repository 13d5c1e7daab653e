"""The pipeline's agent commands: argparse registrations and thin handlers, one module a command.

Each module exposes `register(subparsers)`; specops.cli imports only the module of the command run
(the rooms behind the handlers are imported when a handler runs):
  step_commands.py  `step prepare|extract|validate|vocab|train|metrics --run NAME`
  runs.py           `tiny`, `run show`
  pipeline.py       `pipeline --run NAME`
  fetch.py          `fetch-list --run NAME`
  vllm.py           `vllm command|serve|wait|extract`
"""
