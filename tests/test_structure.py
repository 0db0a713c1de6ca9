"""The shape of helpers/: no import cycle, and no arrow from a lower layer up to a higher one.

Layers (the developers' guide): config/device → models/data → quant/measure → algorithms → the
workflow modules notebooks call. Imports inside functions count too (they are edges all the same)."""
import ast
from pathlib import Path

HELPERS = Path(__file__).resolve().parents[1] / "helpers"

LAYERS = {
    0: {"config", "device", "validate", "qspec", "cuda_graphs", "plots", "envcheck", "key_numbers", "timing",
        "solutions", "host_alloc", "units", "occupancy"},
    1: {"models", "data", "allocator_ops", "allocator_sim", "allocator_replay", "gpu_share"},
    2: {"quant", "measure", "budget", "budget_inputs", "budget_shape", "budget_layout", "budget_kv", "budget_activations",
        "budget_replay", "calib", "leaks", "stream_read"},
    3: {"gptq", "gptq_kernel", "awq", "kvcache", "evaluate", "llm_compressor", "course_model", "w4_format", "w4_kernel", "decode_attention", "engine_plan",
        "loading", "parallel"},
    4: {"generation", "variants", "gguf_run", "decode_bench", "w4_linear", "tp_run", "kernel_runs"},
    5: {"flow", "budget_check", "widgets", "exercises", "clinic"},
}


def import_graph() -> dict[str, set[str]]:
    graph = {}
    for f in HELPERS.glob("*.py"):
        if f.stem == "__init__":
            continue
        deps = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("helpers."):
                deps.add(node.module.split(".")[1])
        graph[f.stem] = deps
    return graph


def layer_of(module: str) -> int:
    found = [k for k, mods in LAYERS.items() if module in mods]
    assert found, f"helpers/{module}.py is in no layer: add it to LAYERS in {__file__}"
    return found[0]


def test_every_module_has_a_layer_and_imports_only_downwards():
    for module, deps in import_graph().items():
        layer_of(module)      # a module that imports nothing from helpers still needs its place
        for dep in deps:
            assert layer_of(dep) < layer_of(module) or (layer_of(dep) == layer_of(module) and dep != module), \
                f"helpers/{module}.py (layer {layer_of(module)}) imports {dep} (layer {layer_of(dep)})"
            assert layer_of(dep) <= layer_of(module), f"{module} imports upwards: {dep}"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a path ``[a, b, …, a]``, or None (depth-first search)."""
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return path + [m, d]
            if d not in state and (found := visit(d, path + [m])):
                return found
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m, [])):
            return found
    return None


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " → ".join(cycle)


def test_the_cycle_finder_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
