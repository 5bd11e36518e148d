"""GPU catalog: the datasheet numbers a roofline needs, one frozen entry per GPU.

Conventions (every entry follows them, so models can compare GPUs):
- ``peak_flops``: dense (no sparsity) FP16/BF16 tensor-core FLOP/s.
- ``hbm_capacity_bytes``: the marketed "GB" read as GiB, which is what the driver exposes
  (an A100-80GB shows 81920 MiB in nvidia-smi).
- bandwidths in bytes/s; NVLink and PCIe are per direction per GPU (datasheets quote the
  bidirectional sum: A100's "600 GB/s NVLink" is 300 GB/s each way).
- ``network_bandwidth_bytes_per_s``: the inter-node NIC share of one GPU in the matching DGX
  system (one HDR 200 Gb/s NIC per A100, one NDR 400 Gb/s NIC per H100/H200).
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.core.errors import UnknownNameError

GiB = 1 << 30
GB = 10**9
TFLOPS = 10**12


@dataclass(frozen=True, slots=True)
class GPUSpec:
    name: str
    peak_flops: float  # dense FP16/BF16 FLOP/s
    hbm_bandwidth_bytes_per_s: float
    hbm_capacity_bytes: int
    nvlink_bandwidth_bytes_per_s: float  # per direction, per GPU
    pcie_bandwidth_bytes_per_s: float  # per direction (host <-> GPU)
    network_bandwidth_bytes_per_s: float  # inter-node, per GPU
    source: str
    num_sms: int = 108  # streaming multiprocessors (A100: 108; H100/H800/H200 SXM: 132)

    def __post_init__(self) -> None:
        for field_name in ("peak_flops", "hbm_bandwidth_bytes_per_s", "hbm_capacity_bytes",
                           "nvlink_bandwidth_bytes_per_s", "pcie_bandwidth_bytes_per_s",
                           "network_bandwidth_bytes_per_s"):
            if not getattr(self, field_name) > 0:
                raise ValueError(f"GPUSpec {self.name}: {field_name} must be > 0")

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity above which a kernel is compute-bound."""
        return self.peak_flops / self.hbm_bandwidth_bytes_per_s


_A100_SRC = ("NVIDIA A100 Tensor Core GPU datasheet (SXM column), "
             "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
             "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf; NIC: NVIDIA DGX A100 user guide "
             "(8x ConnectX-6 HDR 200 Gb/s)")
_A800_SRC = ("NVIDIA A800 Tensor Core GPU datasheet (SXM), https://www.nvidia.cn/data-center/a800/ "
             "(A100 silicon with NVLink cut to 400 GB/s); NIC as DGX A100")
_H100_SRC = ("NVIDIA H100 Tensor Core GPU datasheet (SXM column), "
             "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet; "
             "NIC: NVIDIA DGX H100 user guide (8x ConnectX-7 NDR 400 Gb/s)")
_H800_SRC = ("NVIDIA H800 Tensor Core GPU datasheet (SXM), https://www.nvidia.cn/data-center/h800/ "
             "(H100 silicon with NVLink cut to 400 GB/s); NIC as DGX H100")
_H200_SRC = ("NVIDIA H200 Tensor Core GPU datasheet (SXM column), https://www.nvidia.com/en-us/data-center/h200/; "
             "NIC: NVIDIA DGX H200 (8x ConnectX-7 NDR 400 Gb/s)")

_A40_SRC = ("NVIDIA A40 datasheet, https://images.nvidia.com/content/Solutions/data-center/a40/"
            "nvidia-a40-datasheet.pdf; NIC: assumed one 200 Gb/s NIC per GPU, as DGX A100 (not a DGX part)")

GPUS: dict[str, GPUSpec] = {
    spec.name: spec
    for spec in (
        # A100 SXM: 312 TFLOPS BF16 dense, 1,555 GB/s HBM2 (40GB), NVLink 600 GB/s bidir, PCIe gen4 64 GB/s bidir.
        GPUSpec("A100-40GB", 312 * TFLOPS, 1555 * GB, 40 * GiB, 300 * GB, 32 * GB, 25 * GB, _A100_SRC),
        # A100 80GB SXM: same compute, 2,039 GB/s HBM2e.
        GPUSpec("A100-80GB", 312 * TFLOPS, 2039 * GB, 80 * GiB, 300 * GB, 32 * GB, 25 * GB, _A100_SRC),
        # A800 80GB SXM: A100 80GB with NVLink 400 GB/s bidir.
        GPUSpec("A800-80GB", 312 * TFLOPS, 2039 * GB, 80 * GiB, 200 * GB, 32 * GB, 25 * GB, _A800_SRC),
        # H100 SXM: 989 TFLOPS BF16 dense (1,979 with sparsity), 3.35 TB/s HBM3, NVLink 900 GB/s bidir, PCIe gen5.
        GPUSpec("H100-80GB", 989 * TFLOPS, 3350 * GB, 80 * GiB, 450 * GB, 64 * GB, 50 * GB, _H100_SRC, num_sms=132),
        # H800 SXM: H100 with NVLink 400 GB/s bidir.
        GPUSpec("H800-80GB", 989 * TFLOPS, 3350 * GB, 80 * GiB, 200 * GB, 64 * GB, 50 * GB, _H800_SRC, num_sms=132),
        # H200 SXM: H100 compute, 141 GB HBM3e at 4.8 TB/s.
        GPUSpec("H200", 989 * TFLOPS, 4800 * GB, 141 * GiB, 450 * GB, 64 * GB, 50 * GB, _H200_SRC, num_sms=132),
        # A40 (PCIe, Ampere GA102): 149.7 TFLOPS FP16 tensor dense, 696 GB/s GDDR6, NVLink bridge 112.5 GB/s
        # bidir (pairs), PCIe gen4; the GPU of Vidur's A40 profiles and CPU-overhead host.
        GPUSpec("A40", 149.7 * TFLOPS, 696 * GB, 48 * GiB, 56.25 * GB, 32 * GB, 25 * GB, _A40_SRC, num_sms=84),
    )
}

_ALIASES = {
    "a100": "A100-80GB", "a100-80g": "A100-80GB", "a100-sxm-80gb": "A100-80GB",
    "a100-40g": "A100-40GB", "a800": "A800-80GB",
    "h100": "H100-80GB", "h100-sxm": "H100-80GB", "h100-sxm-80gb": "H100-80GB",
    "h800": "H800-80GB", "h200-141gb": "H200", "a40-48gb": "A40",
}
_BY_KEY = {name.lower(): name for name in GPUS} | _ALIASES


def get_gpu(name: str) -> GPUSpec:
    """Look a GPU up by name, case-insensitively ("a100-80gb", "H100")."""
    key = _BY_KEY.get(name.strip().lower())
    if key is None:
        raise UnknownNameError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}")
    return GPUS[key]
