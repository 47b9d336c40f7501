"""The embedded broker's transport (scheduler/broker_sql.py): chosen for `sqla+` URLs, its wait between empty
polls, and messages through it on a real SQLite broker."""

from __future__ import annotations

from pathlib import Path

import pytest
from kombu import Connection

from scheduler import broker_sql
from scheduler.celery_app import make_celery
from scheduler.settings import CelerySettings, Settings


def test_the_wait_grows_with_the_quiet_from_the_fast_interval_to_the_idle_one() -> None:
    t = broker_sql.Transport.__new__(broker_sql.Transport)  # the schedule only: no connection
    t.polling_interval, t.idle_polling_interval = 0.05, 0.5
    waits = [t.wait_after_empty_poll(idle) for idle in (0.0, 0.1, 0.2, 0.4, 1.0, 2.0, 10.0, 1e9)]
    assert waits[0] == waits[1] == 0.05  # right after a message: the fast rate
    assert waits == sorted(waits) and waits[3] == pytest.approx(0.1) and waits[4] == pytest.approx(0.25)
    assert waits[-3:] == [0.5, 0.5, 0.5]  # never longer than the idle interval


def test_a_sqla_broker_url_gets_this_transport_and_its_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("polling_interval", "idle_polling_interval"):  # class attributes: restored after
        monkeypatch.setattr(broker_sql.Transport, name, getattr(broker_sql.Transport, name))
    settings = Settings(
        home=tmp_path,
        celery=CelerySettings(
            broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}",
            broker_poll_seconds=0.02,
            broker_idle_poll_seconds=0.3,
        ),
    )
    app = make_celery(settings)
    with app.connection_for_write() as conn:
        assert isinstance(conn.transport, broker_sql.Transport)
        assert (conn.transport.polling_interval, conn.transport.idle_polling_interval) == (0.02, 0.3)
    # an idle interval below the fast one is raised to it
    settings.celery.broker_idle_poll_seconds = 0.01
    make_celery(settings)
    assert broker_sql.Transport.idle_polling_interval == 0.02


def test_messages_go_through_after_a_quiet_spell(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'broker.db'}"
    with Connection(url, transport="scheduler.broker_sql:Transport") as conn:
        queue = conn.SimpleQueue("q")
        with pytest.raises(queue.Empty):  # the consumer polls an empty queue for a while: its wait grows
            queue.get(timeout=1.0)
        with Connection(url, transport="scheduler.broker_sql:Transport") as producer:
            producer.SimpleQueue("q").put({"n": 1})
            producer.SimpleQueue("q").put({"n": 2})
        got = [queue.get(timeout=5.0), queue.get(timeout=5.0)]
        for message in got:
            message.ack()
        assert [m.payload for m in got] == [{"n": 1}, {"n": 2}]
        queue.close()
