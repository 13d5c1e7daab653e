"""Wheels brought to a host without internet: packed into parts checked by digest, assembled on the
host when every part has arrived, installed into an env (the serve env of a GPU host: vLLM's CUDA
build over the host's own torch). Standard library only: it runs before anything else is installed."""

from specops.wheelhouse._bundle import (
    MANIFEST,
    Drop,
    check_parts,
    pack,
    read_manifest,
    sha256_file,
    unpack,
    wheel_distribution,
)
from specops.wheelhouse._install import install

__all__ = ["MANIFEST", "Drop", "check_parts", "install", "pack", "read_manifest", "sha256_file", "unpack",
           "wheel_distribution"]
