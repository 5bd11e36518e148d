import pytest

from servelab.catalog.gpus import GPUS, get_gpu

EXPECTED = {"A100-40GB", "A100-80GB", "A800-80GB", "H100-80GB", "H800-80GB", "H200", "A40"}


def test_catalog_has_the_listed_gpus_with_sources():
    assert set(GPUS) == EXPECTED
    for spec in GPUS.values():
        assert spec.source.startswith("NVIDIA") and "http" in spec.source


@pytest.mark.parametrize("name", ["a100-80gb", "A100-80GB", " h100 ", "H200"])
def test_lookup_is_case_insensitive(name):
    assert get_gpu(name).name in EXPECTED


def test_unknown_gpu_lists_known_names():
    with pytest.raises(KeyError, match="A100-80GB"):
        get_gpu("V100")


def test_datasheet_numbers():
    a100, h100, h200 = get_gpu("A100-80GB"), get_gpu("H100-80GB"), get_gpu("H200")
    assert a100.peak_flops == 312e12 and a100.hbm_bandwidth_bytes_per_s == 2039e9
    assert get_gpu("A100-40GB").hbm_bandwidth_bytes_per_s == 1555e9
    assert h100.peak_flops == 989e12 and h100.hbm_bandwidth_bytes_per_s == 3350e9
    assert h200.hbm_bandwidth_bytes_per_s == 4800e9 and h200.hbm_capacity_bytes > h100.hbm_capacity_bytes
    # export variants: same compute and memory, NVLink cut to 400 GB/s bidirectional
    for export, full in (("A800-80GB", "A100-80GB"), ("H800-80GB", "H100-80GB")):
        assert get_gpu(export).peak_flops == get_gpu(full).peak_flops
        assert get_gpu(export).nvlink_bandwidth_bytes_per_s == 200e9 < get_gpu(full).nvlink_bandwidth_bytes_per_s
    assert a100.ridge_flops_per_byte == pytest.approx(153, rel=0.01)
    a40 = get_gpu("a40")  # the GPU of the A40 operator profiles and CPU-overhead host
    assert a40.peak_flops == pytest.approx(149.7e12) and a40.hbm_bandwidth_bytes_per_s == 696e9 and a40.num_sms == 84
