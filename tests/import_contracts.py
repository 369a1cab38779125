"""An import-linter contract type: no import cycle between the modules of a package.

import-linter's own cycle contract (``acyclic_siblings``) treats each sub-package as one node, so it
also refuses a package whose modules import a sub-package that imports back another of its modules
(``trainer.train_step`` <- ``trainer.distributed.mesh_placement`` -> ``trainer.placement``), which is
no cycle between modules. This contract looks at modules: in each of ``containers``, every strongly
connected set of two or more modules that import one another (imports inside functions and under
``TYPE_CHECKING`` included) breaks it, reported as one chain with each import's line.

Named in pyproject.toml's ``[tool.importlinter]``: ``contract_types = ["acyclic_modules: ..."]``.
"""

from __future__ import annotations

from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


class AcyclicModulesContract(Contract):
    type_name = "acyclic_modules"

    containers = fields.ListField(subfield=fields.StringField())

    def check(self, graph, verbose: bool) -> ContractCheck:
        del verbose
        cycles = []
        for container in self.containers:  # type: ignore[attr-defined]
            modules = {container} | set(graph.find_descendants(container))
            for component in _strongly_connected(graph, modules):
                cycles.append(_chain(graph, sorted(component)[0], component))
        return ContractCheck(kept=not cycles, warnings=[], metadata={"cycles": cycles})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for chain in check.metadata["cycles"]:
            output.print_error(f"Import cycle through {chain[0][0]}:")
            for importer, imported, lines in chain:
                output.print_error(f"- {importer} -> {imported} ({lines})")
            output.new_line()


def _strongly_connected(graph, modules: set[str]) -> list[set[str]]:
    """The sets of two or more of ``modules`` that import one another (Tarjan's algorithm, iterative)."""
    imports = {m: sorted(graph.find_modules_directly_imported_by(m) & modules) for m in sorted(modules)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in imports:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if i < len(imports[node]):
                work.append((node, i + 1))
                nxt = imports[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def _chain(graph, start: str, component: set[str]) -> list[tuple[str, str, str]]:
    """One cycle through ``start`` inside ``component``: [(importer, imported, lines), ...]."""
    first = min(graph.find_modules_directly_imported_by(start) & component)
    path = [start, *graph.find_shortest_chain(importer=first, imported=start)]
    return [(a, b, _lines(graph, a, b)) for a, b in zip(path, path[1:])]


def _lines(graph, importer: str, imported: str) -> str:
    details = graph.get_import_details(importer=importer, imported=imported)
    return ", ".join(f"l.{d['line_number']}" for d in details) or "?"
