"""benchmarks/cross_state_precision.py: DLRMv2's output with its cross state stored in 16 bits."""

import pytest
import torch

pytest.importorskip("torchrec", reason="torchrec is the optional extra this benchmark's model comes from")

from benchmarks import cross_state_precision as bench  # noqa: E402


def test_it_reports_each_16_bit_storage_and_leaves_the_cross_net_as_it_was(capsys):
    from torchrec.modules.crossnet import LowRankCrossNet

    original = LowRankCrossNet.forward
    bench.main(["--max-rows", "1000", "--batch", "8", "--batches", "1"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("cross state")]
    assert [line.split()[4] for line in lines] == ["bfloat16:", "float16:"]
    errors = [float(line.split("|")[2].split()[0]) for line in lines]
    assert all(0 < e < 1e-2 for e in errors)  # rounding moves the output, by little
    assert LowRankCrossNet.forward is original


def test_stored_as_rounds_the_state_it_stores():
    """A one-layer net with a zero W: x_1 = x0 * b + x0, each stored rounded."""
    from torchrec.modules.crossnet import LowRankCrossNet

    net = LowRankCrossNet(in_features=8, num_layers=1, low_rank=2)
    with torch.no_grad():
        net.W_kernels[0].zero_()
        net.bias[0].fill_(0.5)
    x0 = torch.randn(4, 8) * 1000 + 0.1
    got = bench.stored_as(torch.bfloat16)(net, x0)
    want = (x0.bfloat16().float() * 1.5).bfloat16().float()
    assert torch.equal(got, want)


@pytest.mark.parametrize("flag", ["--max-rows", "--batch", "--batches"])
def test_sizes_below_one_are_refused_saying_why(flag, capsys):
    with pytest.raises(SystemExit):
        bench.main([flag, "0"])
    assert "take values >= 1" in capsys.readouterr().err
