import numpy as np
import pytest

from cost_model import XGBCostModel


def rank_corr(a, b):
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def synthetic(n=300, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.random((n, 4)).astype(np.float32)
    groups = np.where(rng.random(n) < 0.5, "small", "large")
    scale = np.where(groups == "large", 100.0, 1.0)  # groups differ by orders of magnitude
    lat = scale * (1.0 + 3 * x[:, 0] + (x[:, 1] - 0.5) ** 2)
    return x, lat, groups


def test_ranks_held_out_configs_across_groups():
    x, lat, groups = synthetic()
    model = XGBCostModel()
    model.update(x[:200], lat[:200], groups[:200])
    pred = model.predict(x[200:])
    for g in ("small", "large"):
        m = groups[200:] == g
        assert rank_corr(pred[m], -lat[200:][m]) > 0.7


def test_failures_rank_last():
    x, lat, groups = synthetic(100)
    lat = lat.copy()
    lat[x[:, 2] > 0.7] = np.inf
    model = XGBCostModel()
    model.update(x, lat, groups)
    pred = model.predict(x)
    assert pred[x[:, 2] > 0.7].mean() < pred[x[:, 2] <= 0.7].mean()


def test_untrained_predicts_zeros_and_cannot_be_saved(tmp_path):
    model = XGBCostModel()
    assert not model.trained and np.all(model.predict(np.zeros((3, 4))) == 0)
    with pytest.raises(ValueError):
        model.save(tmp_path / "m.json")


def test_save_load_json_round_trip(tmp_path):
    x, lat, groups = synthetic()
    model = XGBCostModel(seed=3)
    model.update(x, lat, groups)
    path = tmp_path / "model.json"
    model.save(path)
    assert path.read_text().lstrip().startswith("{")
    again = XGBCostModel.load(path)
    assert again.seed == 3 and again.num_features == 4
    np.testing.assert_allclose(again.predict(x), model.predict(x), rtol=1e-6)
    with pytest.raises(ValueError):
        model.save(tmp_path / "model.pkl")


def test_a_heavier_group_decides_where_groups_disagree():
    """Two groups rank feature 0 oppositely; the one weighted up wins (XGBoost weighs ranking groups)."""
    rng = np.random.default_rng(0)
    x = rng.random((200, 2)).astype(np.float32)
    groups = np.where(np.arange(200) < 160, "others", "mine")
    lat = np.where(groups == "others", 1.0 + x[:, 0], 2.0 - x[:, 0])  # others: small x0 fast; mine: large
    probe = np.array([[0.1, 0.5], [0.9, 0.5]], dtype=np.float32)
    plain, weighted = XGBCostModel(), XGBCostModel()
    plain.update(x, lat, groups)
    weighted.update(x, lat, groups, group_weights={"mine": 8.0})
    assert plain.predict(probe)[0] > plain.predict(probe)[1]  # 160 rows of others outvote 40 of mine
    assert weighted.predict(probe)[1] > weighted.predict(probe)[0]
