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
        return cls(DeviceKind.CUDA if torch.cuda.is_available() else DeviceKind.CPU)

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cuda" if self.kind is DeviceKind.CUDA else "cpu")

    def empty_cache(self) -> None:
        if self.kind is DeviceKind.CUDA:
            torch.cuda.empty_cache()
