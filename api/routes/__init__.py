"""HTTP routes: each parses input, calls one service and maps the result."""
