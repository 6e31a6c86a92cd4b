"""`agenttx ui`: a local web app over a store, for the people around an agent (issue 24).

`_svg` draws pictures (pure: small value objects in, SVG text out); `_pictures` turns what the
store returns (a transaction read back, a plan run's image) into those drawings. Imported only
by `agenttx ui`, never by `import agenttx`.

The app: `_command` is the `agenttx ui` command (plugged into the command line by
`agenttx.__main__`; it imports Starlette, uvicorn and Jinja2 only when it runs, and says which
extra to install when they are missing); `_app` builds the Starlette app (`make_app`);
`_security` holds the token, the CSRF token, the origin check and the response headers;
`_views` reads the store into what the runs and the audit pages show, `_detail` a transaction's
and a plan run's pages, `_inbox` what waits for a person and the decisions a person makes, through
the same book as `agenttx approve | reject | review`; `_values` makes every value from an agent
or a tool safe to show. Templates (`templates/`) and static files (`static/`) ship in the package.
"""

from __future__ import annotations

from ._command import add_ui_command

__all__ = ["add_ui_command"]
