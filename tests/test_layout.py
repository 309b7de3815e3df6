"""The package's layout, as tools/import_graph.py checks it: no import cycle, no import
that points back up its layers, no module over its length."""

from __future__ import annotations

from tool_modules import load_tool


def test_no_import_points_back_up_the_layers_and_no_module_is_over_its_length():
    graph = load_tool("import_graph")
    edges = graph.graph()
    assert graph.cycles(edges) == []
    assert graph.upward(edges) == []
    assert graph.too_long() == []
    assert all(graph.layer(name) is not None for name in edges), "every module has a layer"


def test_an_import_up_the_layers_is_found(tmp_path):
    graph = load_tool("import_graph")
    package = tmp_path / "tunecache"
    (package / "store").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "switch.py").write_text("")
    (package / "store" / "__init__.py").write_text("from .. import switch\n")
    assert graph.upward(graph.graph(root=tmp_path)) == ["tunecache.store -> tunecache.switch"]
