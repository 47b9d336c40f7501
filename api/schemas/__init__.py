"""Request and response models of the HTTP API (named <Thing>Create / <Thing>Public / <Things>Page)."""
