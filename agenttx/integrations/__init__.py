"""Integrations with agent SDKs and frameworks: one module each, imported on its own.

`from agenttx.integrations import openai` needs the `agenttx[openai]` extra; nothing here is
imported by `import agenttx`, and each module imports its SDK only when it is itself imported.
See docs/integrations.md.
"""
