"""The packages' layers (docs/architecture.md, "Where each part lives"): every import points down or
sideways within its layer, never up, no two packages import each other, and the two services and the
client SDK stand alone (``build_engines`` is the pipeline the ``sluice`` CLI runs: below the control
plane). Read from the source (imports inside functions included), so a lazy import
cannot hide an arrow."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sluice", "sluice_client", "cpu_engine", "replicas", "gateway", "control_plane", "build_engines")
SERVICES = {"gateway", "control_plane"}

# Lower first. Within sluice: the wire, then the core, then the stores.
RANK = {"sluice_client": 0, "sluice.wire": 0, "sluice": 1, "sluice.stores": 2, "cpu_engine": 2, "replicas": 3}
RANK.update(build_engines=4, gateway=5, control_plane=5)


def unit(module: str) -> str:
    """The package a module belongs to for these rules: ``sluice.<sub>`` and ``control_plane.<sub>``
    count as packages of their own (their circles are what the rules are for); the rest by top level."""
    parts = module.split(".")
    if parts[0] in ("sluice", "control_plane", "gateway") and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0]


def layer(unit_name: str) -> int | None:
    if unit_name in RANK:
        return RANK[unit_name]
    if unit_name.startswith("sluice.stores"):
        return RANK["sluice.stores"]
    top = unit_name.split(".")[0]
    return RANK.get(top if top != "sluice" else "sluice")


def imports() -> list[tuple[str, str, str]]:
    """(importing module, imported module, file) for every import of one of our packages."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                found += [
                    (module, name, str(path.relative_to(ROOT)))
                    for name in names
                    if name.split(".")[0] in PACKAGES
                ]
    return found


def test_no_import_points_up_a_layer() -> None:
    upward = []
    for src, dst, path in imports():
        src_layer, dst_layer = layer(src), layer(dst)
        assert src_layer is not None and dst_layer is not None, (src, dst)
        if dst_layer > src_layer:
            upward.append(f"{path}: {src} -> {dst}")
    assert upward == []


def test_no_two_packages_import_each_other() -> None:
    edges: dict[str, set[str]] = defaultdict(set)
    for src, dst, _ in imports():
        a, b = unit(src), unit(dst)
        if a != b and not b.startswith(a + ".") and not a.startswith(b + "."):
            edges[a].add(b)
    circles = sorted({tuple(sorted((a, b))) for a in edges for b in edges[a] if a in edges.get(b, ())})
    assert circles == []


def test_the_services_and_the_client_sdk_stand_alone() -> None:
    crossing = [
        f"{path}: {src} -> {dst}"
        for src, dst, path in imports()
        if (src.split(".")[0] in SERVICES and dst.split(".")[0] in SERVICES - {src.split(".")[0]})
        or (src.split(".")[0] == "sluice_client") != (dst.split(".")[0] == "sluice_client")
    ]
    assert crossing == []
