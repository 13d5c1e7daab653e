"""What both sides share: the one part of the agent that the control side (remote/) imports.

Standard library only, and light: the workstation imports it on every task and the agent on every call.
Each module is imported by name (`from specops.contract import commandline`); this face loads none of
them, so `job list` (what `invoke status` waits for) pays only for what it reads.

  protocol      job states and records, the agent's exit codes, safe names, Endpoint (HOST:PORT)
  step_table    every step of a run in order: what it reads and writes, its run-config key, scope, figures
  commandspec   Command, Flag, Kind, Rule: one declaration per agent command, its builder and its parser
  commandline   the agent's commands as specs, and one builder each (`step_extract(run=..., part=(0, 2))`)
  values        the kinds of value a flag takes and their parsers (whole numbers, shares, sweeps, JSON)
  errors        BadInput (exit 2) and CheckFailed (exit 1): one line each
  progress      one line for people on stderr
"""
