"""The scanner-profile probe: a model that reads brightness as a class cue is caught, one that does not is not."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from datasets.transforms import IMAGENET_MEAN, IMAGENET_STD, ScannerProfile
from flower_apps.ultrasound.data import UltrasoundData
from flower_apps.ultrasound.probe import main, probe_rows, probe_run, probs_under, profile_centre


class BrightIsClassA(nn.Module):
    """Class 0 ('a') when the mean intensity exceeds 0.5: a pure scanner shortcut."""

    def forward(self, x):
        m = (x[:, 0] * IMAGENET_STD[0] + IMAGENET_MEAN[0]).mean(dim=(1, 2))
        return torch.stack([20 * (m - 0.5), -20 * (m - 0.5)], 1)


class Blind(nn.Module):
    """Ignores intensity: the same logits for every image."""

    def forward(self, x):
        return torch.tensor([[0.0, 1.0]]).expand(len(x), 2)


def _data() -> UltrasoundData:
    def imgs(n):  # constant images at intensity 0.4: 'dark' for BrightIsClassA
        return torch.full((n, 8, 8), 102, dtype=torch.uint8)

    x = {"train": imgs(8), "val": imgs(2), "test": imgs(8)}
    y = {"train": torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]), "val": torch.tensor([0, 1]),
         "test": torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])}
    profiles = [ScannerProfile((0.2, 0.4), (0.9, 1.1), 15.0),  # client 0 (all class a): a bright scanner
                ScannerProfile((-0.1, 0.1), (0.8, 1.0), 5.0)]  # client 1 (all class b): centre brightness 0
    return UltrasoundData("toy", True, [], ("a", "b"), x, y, [np.arange(4), np.arange(4, 8)],
                          [np.arange(1), np.arange(1, 2)], profiles)


def test_profile_centre_is_the_midpoint_without_rotation():
    c = profile_centre(ScannerProfile((0.2, 0.4), (0.9, 1.1), 15.0))
    assert c.brightness == pytest.approx((0.3, 0.3)) and c.contrast == pytest.approx((1.0, 1.0))
    assert c.rotation_deg == 0.0


def test_probs_under_a_profile_are_deterministic():
    data = _data()
    x = torch.randint(0, 256, (5, 8, 8), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    prof = profile_centre(data.profiles[0])
    a = probs_under(BrightIsClassA(), x, prof, torch.device("cpu"))
    b = probs_under(BrightIsClassA(), x, prof, torch.device("cpu"))
    assert np.array_equal(a, b)
    assert not np.allclose(a, probs_under(BrightIsClassA(), x, None, torch.device("cpu")))


def test_probe_catches_a_brightness_shortcut():
    rows = probe_rows(BrightIsClassA(), _data())
    assert [r["profile"] for r in rows] == ["plain", "client 0", "client 1"]
    plain, bright, neutral = rows
    assert plain["recall a"] == 0.0 and plain["recall b"] == 1.0  # dark test images: all called 'b'
    assert bright["recall a"] == 1.0 and bright["recall b"] == 0.0  # client 0's scanner makes them 'a'
    assert neutral["recall a"] == 0.0
    assert bright["client share a (%)"] == "100.0" and neutral["client share b (%)"] == "100.0"
    assert bright["brightness"] == pytest.approx(0.3) and bright["contrast"] == pytest.approx(1.0)


def test_probe_shows_nothing_for_a_model_that_ignores_the_scanner():
    rows = probe_rows(Blind(), _data())
    assert {(r["recall a"], r["recall b"]) for r in rows} == {(0.0, 1.0)}


def test_cli_refuses_a_folder_without_final_model_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([str(tmp_path)])
    assert "no final_model.pt" in capsys.readouterr().err


def test_probe_run_names_a_folder_that_is_not_a_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        probe_run(tmp_path)
