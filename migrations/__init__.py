"""Alembic migrations of the platform database (portable between SQLite and PostgreSQL)."""
