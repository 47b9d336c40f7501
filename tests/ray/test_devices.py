"""Which device a job's roles get: the Ray cluster's, not the driver process's."""

from __future__ import annotations

import ray

from runtime.devices import Device, DeviceKind


def test_roles_get_cuda_when_the_cluster_advertises_gpus_fake_gpu() -> None:
    """A Ray job's driver holds no GPU (Ray may hide every GPU from it), so `Device.for_roles` reads the
    cluster's resources. This machine has no GPU: the cluster declares one it does not have (fake GPU), which
    is all `for_roles` reads; without Ray, or on a cluster without GPUs, it is this process's device."""
    assert Device.for_roles() == Device.detect()  # not connected
    ray.init(address="local", num_cpus=1, num_gpus=1, include_dashboard=False, logging_level="WARNING")
    try:
        assert Device.detect().kind is DeviceKind.CPU
        assert Device.for_roles().kind is DeviceKind.CUDA
    finally:
        ray.shutdown()
    ray.init(address="local", num_cpus=1, num_gpus=0, include_dashboard=False, logging_level="WARNING")
    try:
        assert Device.for_roles().kind is DeviceKind.CPU
    finally:
        ray.shutdown()
