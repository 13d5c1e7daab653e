"""Import-linter contracts the built-in types cannot express.

`only_through`: the source packages import the target package through the allowed parts of it only
(remote/ reaches the agent through specops.contract): a new module of the target is outside at once, with
no list of forbidden modules to keep up to date.

`faces`: a room imports another only through its face.

`type = "faces"` (registered in pyproject.toml [tool.importlinter] contract_types). The rooms are the
sub-packages of each `containers` package. An import of a module inside room R, made by a module of
the container outside R, is through R's face when it is written `from R import NAME` (NAME re-exported
by R/__init__.py, a submodule included: `from specops.pipeline.data import heldout`), and a broken
rule otherwise (`from specops.pipeline.data.heldout import PROMPTS_FILE`). grimp records both as an
import of the submodule, so the written line decides, as a reader of the code would. Modules outside
the container (specops.cli's lazy registry of the command modules) are not rooms and are not checked.
"""

from __future__ import annotations

import re
from typing import Any

from importlinter import Contract, ContractCheck, fields, output


class OnlyThroughContract(Contract):
    """source_modules: the importers (with their descendants); target: the package they reach into; allowed:
    the parts of it they may import (each with its descendants)."""

    type_name = "only_through"

    source_modules = fields.ListField(subfield=fields.StringField())
    target = fields.StringField()
    allowed = fields.ListField(subfield=fields.StringField())

    def check(self, graph: Any, verbose: bool) -> ContractCheck:
        importers = {module for source in self.source_modules  # type: ignore[attr-defined]
                     for module in (source, *graph.find_descendants(source))}
        target: str = self.target  # type: ignore[attr-defined]
        allowed = tuple(self.allowed)  # type: ignore[attr-defined]
        broken = []
        for imported in sorted(graph.find_descendants(target)):
            if any(imported == part or imported.startswith(part + ".") for part in allowed):
                continue
            for importer in sorted(graph.find_modules_that_directly_import(imported) & importers):
                for detail in graph.get_import_details(importer=importer, imported=imported):
                    broken.append({"importer": importer, "imported": imported,
                                   "line_number": detail["line_number"], "line": detail["line_contents"]})
        return ContractCheck(kept=not broken, metadata={"broken": broken})

    def render_broken_contract(self, check: ContractCheck) -> None:
        allowed = " or ".join(self.allowed)  # type: ignore[attr-defined]
        for link in check.metadata["broken"]:
            output.print_error(f"- {link['importer']} -> {link['imported']} (l.{link['line_number']}): "
                               f"{link['line']!r}; only {allowed} may be imported", bold=False)
            output.new_line()


class FacesContract(Contract):
    """containers: the packages whose sub-packages are rooms. exempt_importers: modules of a container
    allowed past the faces for now (each with a reason in the configuration)."""

    type_name = "faces"

    containers = fields.ListField(subfield=fields.StringField())
    exempt_importers = fields.ListField(subfield=fields.StringField(), required=False, default=[])

    def check(self, graph: Any, verbose: bool) -> ContractCheck:
        broken = []
        for container in self.containers:  # type: ignore[attr-defined]
            rooms = sorted(child for child in graph.find_children(container) if graph.find_children(child))
            inside = {container, *graph.find_descendants(container)}
            for room in rooms:
                own = {room, *graph.find_descendants(room)}
                for imported in sorted(own - {room}):
                    for importer in sorted(graph.find_modules_that_directly_import(imported) & inside - own):
                        if importer in self.exempt_importers:  # type: ignore[attr-defined]
                            continue
                        for detail in graph.get_import_details(importer=importer, imported=imported):
                            if not _through_face(detail["line_contents"], room):
                                broken.append({"importer": importer, "imported": imported, "room": room,
                                               "line_number": detail["line_number"],
                                               "line": detail["line_contents"]})
        return ContractCheck(kept=not broken, metadata={"broken": broken})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for link in check.metadata["broken"]:
            output.print_error(f"- {link['importer']} -> {link['imported']} (l.{link['line_number']}): "
                               f"{link['line']!r}; import it from the face, {link['room']}", bold=False)
            output.new_line()


def _through_face(line: str, room: str) -> bool:
    return re.match(rf"from {re.escape(room)} import ", line.strip()) is not None
