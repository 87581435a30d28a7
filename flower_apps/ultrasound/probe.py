"""Scanner-profile probe: does a finished model read a client's scanner as a class cue?

On the non-IID split every client trains with its own feature-skew augmentation (a "scanner":
:class:`datasets.transforms.ScannerProfile`), and label skew can put most images of one class on one
client. A model could then learn that client's brightness / contrast as evidence for the class. The
probe evaluates the run's final global model on the test images, plain and shifted to each client's
profile centre (brightness and contrast at the midpoint of the client's ranges, no rotation), and
reports the metrics per profile beside each client's class shares. A shortcut shows as a class whose
recall rises under the profile of the client that holds it.

A diagnostic of model behaviour, not a privacy tool: it reads the run's own data plan and final model.
Usage (writes ``profile_probe.csv`` / ``.md`` into each run folder and prints the Markdown)::

    python -m flower_apps.ultrasound.probe RUN_FOLDER [RUN_FOLDER ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from datasets.transforms import ScannerProfile
from flower_apps.ultrasound.metrics import classification_metrics

PROBE_STEM = "profile_probe"


def profile_centre(prof: ScannerProfile) -> ScannerProfile:
    """The deterministic centre of a client's profile: mid brightness, mid contrast, no rotation."""
    b = (prof.brightness[0] + prof.brightness[1]) / 2
    c = (prof.contrast[0] + prof.contrast[1]) / 2
    return ScannerProfile((b, b), (c, c), 0.0)


@torch.no_grad()
def probs_under(model: nn.Module, x: torch.Tensor, prof: ScannerProfile | None, device: torch.device,
                batch_size: int = 128) -> np.ndarray:
    """Softmax probabilities of uint8 images ``x`` after ``prof`` (None: plain), through the training
    input path (:func:`flower_apps.ultrasound.train.model_input`)."""
    from flower_apps.ultrasound.train import model_input

    model = model.to(device).eval()
    out = []
    for s in range(0, len(x), batch_size):
        xb = x[s : s + batch_size]
        owners = np.zeros(len(xb), dtype=np.int64)
        gen = torch.Generator().manual_seed(0)  # a centred profile draws nothing random; kept for the API
        inp = model_input(xb, owners if prof else None, [prof] if prof else None, gen, device)
        out.append(torch.softmax(model(inp).float(), 1).cpu())
    return torch.cat(out).numpy()


def probe_rows(model: nn.Module, data, device: torch.device = torch.device("cpu")) -> list[dict]:
    """One row for the plain test set, then one per client profile (``data``: an ``UltrasoundData``)."""
    x, y = data.x["test"], data.y["test"].numpy()
    ytr = data.y["train"].numpy()
    names = data.class_names

    def row(label: str, prof: ScannerProfile | None, shares: dict) -> dict:
        m = classification_metrics(y, probs_under(model, x, prof, device))
        cm = np.asarray(m["confusion"])
        r = {"profile": label,
             "brightness": "" if prof is None else round(prof.brightness[0], 4),
             "contrast": "" if prof is None else round(prof.contrast[0], 4)}
        r.update(shares)
        r.update({"accuracy": m["accuracy"], "auc": m["auc"], "specificity": m["specificity"]})
        for k, name in enumerate(names):  # recall per true class: rows of the confusion matrix
            n = cm[k].sum()
            r[f"recall {name}"] = float(cm[k, k] / n) if n else float("nan")
        return r

    rows = [row("plain", None, {f"client share {n} (%)": "" for n in names})]
    for k, prof in enumerate(data.profiles):
        yk = ytr[data.client_train[k]]
        shares = {f"client share {n} (%)": f"{100 * float(np.mean(yk == c)):.1f}" if len(yk) else ""
                  for c, n in enumerate(names)}
        rows.append(row(f"client {k}", profile_centre(prof), shares))
    return rows


def run_config(folder: Path):
    """The run's :class:`UltrasoundConfig` from its ``config.json``."""
    from flower_apps.ultrasound.config import UltrasoundConfig

    path = folder / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing: not an ultrasound run folder")
    raw = json.loads(path.read_text())
    known = {f.name for f in dataclasses.fields(UltrasoundConfig)}
    return UltrasoundConfig(**{k: v for k, v in raw.items() if k in known})


def probe_run(folder: str | Path) -> str:
    """Probe one finished federated run; writes ``profile_probe.csv`` / ``.md``, returns the Markdown."""
    from flower_apps.common.tables import write_table
    from flower_apps.ultrasound.attacks import load_final_model
    from flower_apps.ultrasound.data import build_data, data_key

    folder = Path(folder)
    cfg = run_config(folder)
    data = build_data(data_key(cfg))
    model = load_final_model(folder, cfg, data.num_classes)  # clear error when final_model.pt is absent
    rows = probe_rows(model, data)
    note = ("Test images shifted to each client's scanner-profile centre (mid brightness, mid contrast, no "
            "rotation); 'plain' is the test set as evaluated. A class whose recall rises under the profile of "
            "the client that holds it points to a scanner shortcut.")
    return write_table(rows, folder / PROBE_STEM, f"Scanner-profile probe: {folder.name}", note, ".3f")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flower_apps.ultrasound.probe", description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="finished federated run folders (with final_model.pt)")
    args = ap.parse_args(argv)
    missing = [r for r in args.runs if not (Path(r) / "final_model.pt").is_file()]
    if missing:  # before any work
        ap.error("no final_model.pt in: " + ", ".join(missing) + " (run folders kept in git carry no weights)")
    for r in args.runs:
        print(probe_run(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
