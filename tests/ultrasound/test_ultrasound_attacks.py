"""ultrasound attacks: an overfit model leaks membership, an untrained one does not; inversion vs DP-SGD view."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from datasets.transforms import IDENTITY_PROFILE
from flower_apps.ultrasound.attacks import (
    Recipe,
    UsAttackSettings,
    attack_run,
    inversion_rows,
    membership_rows,
    reconstruction_figure,
)
from flower_apps.ultrasound.data import UltrasoundData
from flower_apps.ultrasound.train import train_local

SIZE, K = 16, 3


class TinyNet(nn.Module):
    """A small stand-in for the timm backbone at CPU-test scale (3-channel normalized input)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * SIZE * SIZE, 64), nn.Sigmoid(), nn.Linear(64, K))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def make(seed: int | None = None) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0 if seed is None else seed)
        return TinyNet()


def _data(n_train: int = 96) -> UltrasoundData:
    g = torch.Generator().manual_seed(0)
    # Random uint8 images with random labels: fitting the victim's images means memorizing them.
    x = {p: torch.randint(0, 256, (n, SIZE, SIZE), generator=g, dtype=torch.uint8)
         for p, n in (("train", n_train), ("val", 48), ("test", 48))}
    y = {p: torch.randint(0, K, (len(v),), generator=g) for p, v in x.items()}
    clients = [np.arange(0, n_train // 2), np.arange(n_train // 2, n_train)]
    return UltrasoundData("random", True, [], ("a", "b", "c"), x, y, clients, [np.arange(24), np.arange(24, 48)],
                          [IDENTITY_PROFILE] * 2)


RECIPE = Recipe(make, batch_size=16, lr=1e-2)
SMALL = UsAttackSettings(max_candidates=48, num_reference=3, reference_epochs=5, victims=1, iterations=60)


@pytest.fixture(scope="module", autouse=True)
def _threads():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_overfit_model_leaks_membership():
    data = _data()
    model = make(5)
    x, y = data.client_train_data(0)
    train_local(model, x, y, epochs=60, batch_size=16, lr_for_epoch=lambda e: 1e-2, device=torch.device("cpu"),
                seed=0)
    rows = membership_rows(model.eval(), data, RECIPE, SMALL)
    by = {(r["feature"], r["classifier"]): r for r in rows}
    assert by[("loss", "threshold")]["auc"] > 0.8, by[("loss", "threshold")]
    assert by[("logit-confidence", "lira-offline")]["auc"] > 0.8, by[("logit-confidence", "lira-offline")]
    assert len(rows) == 3 * 2 + 2 and all(r["victim"] == 0 for r in rows)


def test_untrained_model_stays_near_chance():
    data = _data()
    rows = membership_rows(make(7).eval(), data, RECIPE, SMALL)
    for r in rows:
        assert abs(r["auc"] - 0.5) < 0.2, r


def test_dp_sgd_view_hides_the_image(tmp_path):
    data = _data()
    model = make(3).eval()
    clear = inversion_rows(model, data, make, "gradient", SMALL)
    noised = inversion_rows(model, data, make, "dp-sgd", SMALL, clip_norm=0.1, noise_multiplier=1.0)
    best = lambda rows: max(r["ssim"] for r in rows)
    assert best(clear) > 0.5, [(r["attack"], r["ssim"]) for r in clear]
    assert best(clear) > best(noised) + 0.3, ([r["ssim"] for r in clear], [r["ssim"] for r in noised])
    assert all(r["seconds_per_image"] > 0 for r in clear + noised)
    assert reconstruction_figure(clear + noised, data, tmp_path / "rec.png", "test").is_file()
    with pytest.raises(ValueError, match="clip_norm"):
        inversion_rows(model, data, make, "dp-sgd", SMALL)


def test_attack_run_names_the_missing_model(tmp_path):
    with pytest.raises(FileNotFoundError, match="final_model.pt"):
        attack_run(tmp_path, object(), SMALL)


@pytest.mark.parametrize("dp_sgd,finetune", [(True, "frozen-bn"), (True, "groupnorm")])
def test_server_saves_the_final_model_the_attacks_load(tmp_path, fake_grid_cls, dp_sgd, finetune):
    """server_main (in-process grid, tiny synthetic run) -> final_model.pt -> the adapter's model.

    The adapter's skeleton takes the saved state strictly (same keys: frozen BN keeps BatchNorm's
    buffers, GroupNorm drops them) and reproduces the run's own final test accuracy and confusion.
    """
    from flwr.app import Context, RecordDict

    from flower_apps.common.results import read_json
    from flower_apps.config import RUN_CONFIG_DEFAULTS
    from flower_apps.router import prepare
    from flower_apps.ultrasound import client_app
    from flower_apps.ultrasound.attacks import load_final_model, model_factory
    from flower_apps.ultrasound.data import build_data, data_key
    from flower_apps.ultrasound.server_app import run_dir, server_main
    from flower_apps.ultrasound.train import evaluate

    _, cfg = prepare({**RUN_CONFIG_DEFAULTS, "study": "ultrasound", "preset": "smoke", "dataset": "synthetic",
                      "num-clients": 2, "num-rounds": 1, "local-epochs": 1, "data-fraction": 0.25,
                      "us-image-size": 32, "us-pretrained": False, "us-dp-sgd": dp_sgd, "us-dp-finetune": finetune,
                      "results-dir": str(tmp_path)})
    grid = fake_grid_cls([101, 102], lambda node, msg: client_app.train(msg, Context(1, node, {}, RecordDict(), {})))
    s = server_main(grid, cfg)
    folder = run_dir(cfg)
    data = build_data(data_key(cfg))
    state = torch.load(folder / "final_model.pt", map_location="cpu", weights_only=True)
    assert list(state) == list(model_factory(cfg, data.num_classes)().state_dict())
    assert any(k.endswith("running_mean") for k in state) == (finetune == "frozen-bn")
    model = load_final_model(folder, cfg, data.num_classes)
    final = evaluate(model, data.x["test"], data.y["test"], torch.device("cpu"))
    assert final["accuracy"] == pytest.approx(s["test_accuracy"], abs=1e-9)
    assert np.asarray(final["confusion"]).tolist() == read_json(folder / "summary.json")["confusion"]


def test_audited_run_is_skipped(tmp_path):
    """A run trained with audit canaries (audit.json in its folder) is reported, never attacked."""
    (tmp_path / "audit.json").write_text("{}")
    assert attack_run(tmp_path, object(), SMALL) == {"skipped": "skipped: audited run", "mia": [], "inversion": []}
    assert not (tmp_path / "attacks_mia.json").exists()
