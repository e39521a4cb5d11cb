import pytest

from autotune import runtime, targets
from autotune.targets import UnknownDevice, host_cpu, resolve


def test_cpu_names_the_detected_host_cpu_never_native():
    dev = resolve("cpu")
    assert dev.name == f"cpu:{host_cpu()}"
    extra = targets.host_extra_features(host_cpu())
    assert dev.to_json() == {"kind": "llvm", "mcpu": host_cpu(), **({"mattr": list(extra)} if extra else {}),
                             "num-cores": dev.cores}
    assert host_cpu() not in ("native", "generic")
    assert str(dev.target().attrs["mcpu"]) == host_cpu()


def test_the_host_gets_the_features_its_llvm_cpu_model_lacks(monkeypatch):
    """A VM showing one CPU's model number and another's instruction sets: AMX where LLVM's model of the name
    has none (and Linux grants it), AVX512-BF16 likewise, nothing where the model has it already or the machine
    lacks it."""
    monkeypatch.setattr(targets, "cpu_flags", lambda: {"avx512f", "amx_tile", "amx_int8", "avx512_bf16"})
    monkeypatch.setattr(runtime, "amx_allowed", lambda: True)
    targets.host_extra_features.cache_clear()
    try:
        assert targets.host_extra_features("rocketlake") == ("+amx-tile", "+amx-int8", "+avx512bf16")
        assert targets.host_extra_features("sapphirerapids") == ()
        monkeypatch.setattr(runtime, "amx_allowed", lambda: False)  # Linux refuses the tile data
        targets.host_extra_features.cache_clear()
        assert targets.host_extra_features("rocketlake") == ("+avx512bf16",)
        monkeypatch.setattr(runtime, "amx_allowed", lambda: True)
        monkeypatch.setattr(targets, "cpu_flags", lambda: {"avx512f"})  # a machine without AMX or BF16
        targets.host_extra_features.cache_clear()
        assert targets.host_extra_features("rocketlake") == ()
    finally:
        targets.host_extra_features.cache_clear()
    assert "mattr" not in resolve("cpu:znver4").to_json() or host_cpu() == "znver4"


def test_named_cpu_and_unknown_devices():
    assert resolve("cpu:znver3").to_json()["mcpu"] == "znver3"
    with pytest.raises(UnknownDevice, match="unknown device"):
        resolve("tpu")


def test_unknown_cpu_names_are_rejected_not_compiled_as_generic():
    with pytest.raises(UnknownDevice, match="does not know the CPU 'foo'"):
        resolve("cpu:foo")


def test_gpu_architectures_carry_their_limits_into_the_tvm_target():
    dev = resolve("cuda:sm_90")
    assert dev.name == "cuda:sm_90" and dev.is_gpu and dev.gpu.sms == 132
    target = dev.target()
    assert target.kind.name == "cuda" and str(target.attrs["arch"]) == "sm_90"
    assert int(target.attrs["max_threads_per_block"]) == dev.gpu.max_threads_per_block == 1024
    assert int(target.attrs["max_shared_memory_per_block"]) == 48 * 1024 < dev.gpu.shared_memory_optin
    assert target.host.kind.name == "llvm" and "mcpu" not in target.host.attrs  # portable host stubs
    assert resolve("cuda:sm_80").gpu.shared_memory_optin == 163 * 1024
    assert resolve("cuda:sm_89").gpu.compute_capability == (8, 9)
    assert all(resolve(f"cuda:{a}").gpu.bandwidth > 0 for a in ("sm_80", "sm_89", "sm_90"))


def test_unknown_gpu_architectures_and_a_missing_local_gpu_are_clear_errors():
    import torch

    with pytest.raises(UnknownDevice, match="unknown GPU architecture 'sm_10'"):
        resolve("cuda:sm_10")
    if not torch.cuda.is_available():
        with pytest.raises(UnknownDevice, match="sees no CUDA GPU"):
            resolve("cuda")
