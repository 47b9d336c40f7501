"""`relax-entrypoint register-pool`: a Ray cluster registered as a pool of the platform, through its admin API.

One-shot and idempotent (compose.yaml runs it at every `up`): the pool is created, or its accelerator and Ray
address brought up to date; the nodes named in RELAX_POOL_NODES are put with their slots; the queue is created
for the team when missing. The pool's nodes then stay in step with Ray's own node list (the beat's node sync
binds these names to Ray's node ids: start each Ray node with `--node-name` set to its name here; on a GPU pool
Ray's GPU counts replace the slots given here, and Ray nodes not named here are added as they join).

Environment:
  RELAX_URL                  the API (e.g. http://api-1:8400)
  RELAX_API_KEY              an admin key (compose: RELAX_BOOTSTRAP_ADMIN_KEY)
  RELAX_POOL                 pool name (default: cluster)
  RELAX_POOL_ACCELERATOR     cpu, h100, h200, ... (default: cpu)
  RELAX_POOL_RAY_ADDRESS     the cluster's Ray Jobs API (default: http://ray-head:8265)
  RELAX_POOL_NODES           NAME=SLOTS,... (default: ray-head=0,ray-worker=2)
  RELAX_POOL_QUEUE           queue name (default: default), of team RELAX_POOL_TEAM (default: default)
  RELAX_POOL_WAIT_SECONDS    how long to wait for the API to answer (default: 120)
"""

from __future__ import annotations

import os
import sys
import time

from client.sdk import ApiError, RelaxClient


def parse_nodes(text: str) -> dict[str, int]:
    """`a=2,b=0` -> {"a": 2, "b": 0}; a clear error naming the variable otherwise."""
    nodes: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, slots = item.partition("=")
        if not sep or not name.strip() or not slots.strip().isdigit():
            raise SystemExit(f"RELAX_POOL_NODES: {item!r} is not NAME=SLOTS (e.g. ray-worker=2)")
        nodes[name.strip()] = int(slots)
    return nodes


def _wait_for_api(client: RelaxClient, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            client.pools()
            return
        except ApiError as err:
            if err.status != 0 or time.monotonic() > deadline:  # 0: unreachable
                raise
        time.sleep(1)


def main() -> int:
    env = os.environ.get
    pool = env("RELAX_POOL", "cluster")
    accelerator = env("RELAX_POOL_ACCELERATOR", "cpu")
    address = env("RELAX_POOL_RAY_ADDRESS", "http://ray-head:8265")
    nodes = parse_nodes(env("RELAX_POOL_NODES", "ray-head=0,ray-worker=2"))
    queue, team = env("RELAX_POOL_QUEUE", "default"), env("RELAX_POOL_TEAM", "default")
    client = RelaxClient(env("RELAX_URL"), env("RELAX_API_KEY"))
    _wait_for_api(client, float(env("RELAX_POOL_WAIT_SECONDS", "120")))
    if any(p["name"] == pool for p in client.pools()):
        client.update_pool(pool, accelerator=accelerator, ray_address=address)
        action = "updated"
    else:
        client.create_pool(pool, accelerator, ray_address=address)
        action = "created"
    for name, slots in nodes.items():
        client.put_node(pool, name, slots)
    if not any(q["name"] == queue for q in client.queues()):
        client.create_queue(queue, pool, team, sum(nodes.values()))
    print(f"pool {pool} {action}: {accelerator}, Ray {address}, nodes {nodes}; queue {queue} of team {team}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
