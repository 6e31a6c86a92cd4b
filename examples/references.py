"""Pass data between tool calls with `${steps.N.path}` references, and see what failure looks like.

Run it with `python examples/references.py`. It resolves the arguments an agent might send for
three steps of a checkout, prints each resolution, shows the two failure messages an agent gets
back for bad references, and ends with the dependency graph the references produced.
"""

from __future__ import annotations

import agenttx

# Outputs of the steps that have completed so far.
outputs: dict[int, agenttx.JSONValue] = {
    1: {"customer": {"id": 101, "email": "ada@example.com", "tags": ["vip", "eu"]}},
    2: {"items": [{"sku": "SKU-1", "qty": 2}, {"sku": "SKU-9", "qty": 1}], "total": 42.5},
}
graph = agenttx.DependencyGraph()
graph.add_step(1, "lookup_customer", {"email": "ada@example.com"})
graph.record_output(1, outputs[1])
graph.add_step(2, "get_cart", {"customer_id": 101})
graph.record_output(2, outputs[2])

# Step 3: a whole-string reference keeps its JSON type; embedded ones are interpolated.
arguments = {
    "customer_id": "${steps.1.customer.id}",  # -> 101, an integer
    "first_sku": "${steps.2.items.0.sku}",  # numeric segments index arrays
    "note": "for ${steps.1.customer.email}, tags ${steps.1.customer.tags}",
    "template": "literal $${steps.1.customer.id} stays as text",  # `$${` escapes
}
resolution = agenttx.resolve_references(arguments, outputs, current_step=3)
assert resolution.ok
print("step 3 resolved:", resolution.value)
for dependency in resolution.dependencies:
    print(
        f"  depends on step {dependency.from_step}: "
        f"{dependency.source_key} -> {dependency.target_key}"
    )
graph.add_step(3, "create_order", resolution.value, resolution.dependencies)

# Bad references are not raised: the resolution carries the message the agent gets back.
for bad in ({"sku": "${steps.2.items.5.sku}"}, {"id": "${steps.7.id}"}):
    failed = agenttx.resolve_references(bad, outputs, current_step=3)
    print("failure:", failed.error)

# Values that are not JSON are refused with a typed error that names the path.
try:
    agenttx.resolve_references({"ids": {1, 2}}, outputs, current_step=3)
except agenttx.JSONValueError as error:
    print("refused:", error)

print()
print(graph.to_mermaid())
