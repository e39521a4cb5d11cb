import pytest

from autotune.targets import UnknownDevice, host_cpu, resolve


def test_cpu_names_the_detected_host_cpu_never_native():
    dev = resolve("cpu")
    assert dev.name == f"cpu:{host_cpu()}"
    assert dev.to_json() == {"kind": "llvm", "mcpu": host_cpu(), "num-cores": dev.cores}
    assert host_cpu() not in ("native", "generic")
    assert str(dev.target().attrs["mcpu"]) == host_cpu()


def test_named_cpu_and_unknown_devices():
    assert resolve("cpu:znver3").to_json()["mcpu"] == "znver3"
    with pytest.raises(UnknownDevice, match="unknown device"):
        resolve("tpu")


def test_unknown_cpu_names_are_rejected_not_compiled_as_generic():
    with pytest.raises(UnknownDevice, match="does not know the CPU 'foo'"):
        resolve("cpu:foo")
