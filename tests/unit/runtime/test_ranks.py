"""tests/unit/runtime/ranks.py: a gloo world whose rendezvous port was taken between `free_port()` and rank 0's
bind (pytest-xdist neighbours take ports all the time) runs again on a new port."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.unit.runtime import ranks


def _barrier_worker(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from runtime.train.megatron.parallel import init_process_group

    init_process_group(rank, world, "127.0.0.1", port, timeout_minutes=1)
    dist.barrier()
    Path(out, f"rank{rank}-port").write_text(str(port))
    dist.destroy_process_group()


def test_a_taken_rendezvous_port_is_replaced(tmp_path: Path) -> None:
    with socket.socket() as taken:  # a port someone else holds, as a neighbour's connection would
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ranks.spawn(_barrier_worker, (2, port, str(tmp_path)), timeout=120)
    used = {int((tmp_path / f"rank{r}-port").read_text()) for r in range(2)}
    assert len(used) == 1 and port not in used
