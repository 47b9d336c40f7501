"""20 concurrent subscribers of one job's stream against a real uvicorn server on SQLite, finished and running:
each receives every row of the job once, in order, and its end (bench/stream_fanout.py runs 200)."""

from __future__ import annotations

from bench.stream_fanout import bench, parse_args


def test_twenty_subscribers_each_receive_every_row() -> None:
    args = parse_args(
        ["--subscribers", "20", "--metrics", "3000", "--logs", "300", "--steps", "60", "--write-seconds", "3"]
    )
    rows = bench(args)
    assert [r["scenario"] for r in rows] == ["finished", "running"]
    for r in rows:
        assert r["rows_each"] > 3300 and not r["errors"], r
        assert (r["missed"], r["dup"], r["bad"]) == (0, 0, 0), r
