"""Which accelerator a role runs on (CPU or CUDA) and the device-specific calls the roles need."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import torch


class DeviceKind(StrEnum):
    CPU = "cpu"  # no accelerator: roles take fractional CPU slots in Ray
    CUDA = "cuda"  # roles take (fractional) GPUs in Ray


@dataclass(frozen=True)
class Device:
    kind: DeviceKind

    @classmethod
    def detect(cls) -> Device:
        """This process's device: CUDA where torch sees a GPU."""
        return cls(DeviceKind.CUDA if torch.cuda.is_available() else DeviceKind.CPU)

    @classmethod
    def for_roles(cls) -> Device:
        """The device the job's roles get: CUDA when the Ray cluster this process is connected to has GPUs
        (a Ray job's driver holds none itself, and Ray may hide every GPU from it), else this process's."""
        try:
            import ray

            if ray.is_initialized() and float(ray.cluster_resources().get("GPU", 0)) > 0:
                return cls(DeviceKind.CUDA)
        except ImportError:  # pragma: no cover - the runtime always has Ray
            pass
        return cls.detect()

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cuda" if self.kind is DeviceKind.CUDA else "cpu")

    def empty_cache(self) -> None:
        if self.kind is DeviceKind.CUDA:
            torch.cuda.empty_cache()
