"""Which device a job's roles get: the Ray cluster's, not the driver process's."""

from __future__ import annotations

import ray

from runtime.devices import Device, DeviceKind


def test_roles_get_cuda_when_the_cluster_advertises_gpus_fake_gpu() -> None:
    """A Ray job's driver holds no GPU (Ray may hide every GPU from it), so `Device.for_roles` reads the
    cluster's resources. This machine has no GPU: the cluster declares one it does not have (fake GPU), which
    is all `for_roles` reads; without Ray it is this process's device."""
    assert Device.for_roles() == Device.detect()  # not connected
    ray.init(address="local", num_cpus=1, num_gpus=1, include_dashboard=False, logging_level="WARNING")
    try:
        assert Device.detect().kind is DeviceKind.CPU
        assert Device.for_roles().kind is DeviceKind.CUDA
    finally:
        ray.shutdown()


def test_roles_get_the_cpu_on_a_cluster_without_gpus(ray_local) -> None:  # type: ignore[no-untyped-def]
    """The same, on the suite's local Ray (tests/ray/conftest.py), which advertises no GPU: the CPU."""
    assert ray.is_initialized() and not ray.cluster_resources().get("GPU")
    assert Device.for_roles().kind is DeviceKind.CPU
