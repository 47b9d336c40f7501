"""`python -m scheduler.dbinit`: the database made ready for this platform version, on every start of every replica.

Upgrades the configured database (RELAX_DATABASE_URL) to head (scheduler/db/migrate.py, which also records this
version's job-spec defaults), then makes sure the default team (and, when RELAX_BOOTSTRAP_ADMIN_KEY is set, that
admin key) exist. Safe to run concurrently and repeatedly.
"""

from __future__ import annotations

import os

from scheduler.db.engine import Database
from scheduler.db.migrate import upgrade
from scheduler.services.auth import ensure_api_key
from scheduler.services.platform import ensure_team
from scheduler.settings import get_settings


def main() -> None:
    url = get_settings().database_url
    upgrade(url)
    db = Database(url)
    try:
        with db.session() as s:
            ensure_team(s, "default")
            raw = os.environ.get("RELAX_BOOTSTRAP_ADMIN_KEY")
            if raw:
                ensure_api_key(s, raw, name="bootstrap-admin", role="admin", team_id=None)
    finally:
        db.dispose()
    print(f"database at head: {url.split('@')[-1]}")


if __name__ == "__main__":
    main()
