"""Persistence: SQLAlchemy tables, engines and sessions, migrations."""
