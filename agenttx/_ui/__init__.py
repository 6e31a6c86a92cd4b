"""`agenttx ui`: a local web app over a store, for the people around an agent (issue 24).

`_svg` draws pictures (pure: small value objects in, SVG text out); `_pictures` turns what the
store returns (a transaction read back, a plan run's image) into those drawings. Imported only
by `agenttx ui`, never by `import agenttx`.
"""
