"""Node-local data: the one on-disk convention a SuperNode's ``data-path`` folder follows.

In a cross-silo deployment each institution starts its SuperNode with
``--node-config "data-path='/srv/site-a'"``; its ClientApp reads that folder and nothing else.
Whom this protects: an institution's raw records stay on its machine, so the coordinator and
the other institutions only ever receive what the study's protocol sends (model updates,
anonymized statistics); it does not protect the updates themselves (that is the DP wrappers' job).

Every node folder holds ``node.json``, the manifest::

    {"format": "images-npz" | "cancer-csv" | "busi-folder",
     "node": "site-a",                       # a name for messages (optional)
     "clients": {"3": "client-3.npz", ...},  # logical client id -> file or folder in this folder
     ...}                                    # format fields, below

- ``images-npz`` (dfl-dp, unlinkable-dfl): each client's ``.npz`` holds ``x`` (uint8 images,
  ``(n, H, W)`` or ``(n, H, W, C)``) and ``y`` (integer labels); the manifest adds
  ``num_classes`` and the per-channel ``mean``/``std`` the federation normalizes with.
- ``cancer-csv`` (tabular-pdp): each client's CSV has the 15 columns of :mod:`datasets.cancer`,
  validated exactly as the central table (a missing column, a wrong type or an empty file is a
  :class:`NodeDataError` naming the node, the file and the column).
- ``busi-folder`` (ultrasound): each client's folder has the BUSI layout (``benign/``,
  ``malignant/``, ``normal/`` PNGs; ``*_mask*.png`` ignored).

Client entries must be relative paths inside the folder: a manifest cannot make a node read
anything outside its own folder. Every reader checks the manifest first and raises
:class:`NodeDataError` (a :class:`DataError`: one line naming the node, the file and the problem).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from datasets.base import DataError, one_line

MANIFEST = "node.json"
FORMATS = ("images-npz", "cancer-csv", "busi-folder")
EVAL_FILE = "eval.npz"  # the coordinator's held-out set (images-npz studies), written by the export


class NodeDataError(DataError):
    """A node's data folder that cannot be used; the message names the node, the file and the problem."""


@dataclass(frozen=True)
class NodeManifest:
    """A validated ``node.json``: where each logical client's data lies in the node's folder."""

    root: Path
    node: str
    format: str
    clients: dict[int, Path]  # logical client id -> absolute path inside root
    meta: dict[str, Any]

    def fail(self, where: str | Path, problem: str) -> NodeDataError:
        """A :class:`NodeDataError` naming this node, ``where`` and ``problem``."""
        return NodeDataError(f"{self.node}: {where}: {problem}")


def _inside(root: Path, rel: str, node: str) -> Path:
    p = PurePosixPath(rel)
    if not rel or p.is_absolute() or ".." in p.parts:
        raise NodeDataError(f"{node}: {root / MANIFEST}: client path {rel!r} must be a relative path "
                            "inside the node's folder")
    return root / p


def node_folder(data_path: str | Path, study: str) -> Path:
    """The folder a study reads on a node: ``<data-path>/<study>/`` when it has a manifest, else ``<data-path>``.

    A node serving one study puts node.json at the top of its data-path; a node serving several
    keeps one subfolder per study (what the export writes).
    """
    sub = Path(data_path) / study
    return sub if (sub / MANIFEST).is_file() else Path(data_path)


def read_manifest(data_path: str | Path, expected_format: str, node: str = "") -> NodeManifest:
    """Read and check ``<data_path>/node.json``; ``expected_format`` is what the study reads.

    ``node`` names the node in messages: the SuperNode's ``node-name`` (or its id), which the operator
    chose for that machine, so two SuperNodes given the same folder by mistake still tell apart; the
    manifest's ``node`` field (written by the export, the same for every reader of the folder) names it
    only when ``node`` is empty.
    """
    if expected_format not in FORMATS:
        raise ValueError(f"expected_format must be one of {FORMATS}, got {expected_format!r}")
    root = Path(data_path)
    label = node or f"the node at {root}"
    if not root.is_dir():
        raise NodeDataError(f"{label}: data-path '{root}' is not a folder (expected a folder with {MANIFEST})")
    path = root / MANIFEST
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise NodeDataError(f"{label}: {path}: missing; every node folder needs a {MANIFEST} manifest "
                            "(docs/deployment.md, 'Prepare your data folder')") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise NodeDataError(f"{label}: {path}: not valid JSON ({one_line(exc)})") from exc
    if not isinstance(raw, dict):
        raise NodeDataError(f"{label}: {path}: expected a JSON object, got {type(raw).__name__}")
    label = node or str(raw.get("node") or label)
    if raw.get("format") != expected_format:
        raise NodeDataError(f"{label}: {path}: format is {raw.get('format')!r}, this study reads "
                            f"{expected_format!r}")
    clients = raw.get("clients")
    if not isinstance(clients, dict) or not clients:
        raise NodeDataError(f"{label}: {path}: 'clients' must map at least one logical client id to a file")
    out: dict[int, Path] = {}
    for cid, rel in clients.items():
        try:
            k = int(cid)
        except ValueError:
            raise NodeDataError(f"{label}: {path}: client id {cid!r} is not an integer") from None
        if k < 0 or not isinstance(rel, str):
            raise NodeDataError(f"{label}: {path}: client {cid!r} needs an id >= 0 and a relative path")
        out[k] = _inside(root, rel, label)
    meta = {k: v for k, v in raw.items() if k not in ("format", "node", "clients")}
    return NodeManifest(root, label, expected_format, dict(sorted(out.items())), meta)


# ----------------------------------------------------------------------------- images-npz
@dataclass(frozen=True)
class ImageClient:
    """One logical client's raw images (uint8) and labels (int64), as stored on its node."""

    x: np.ndarray
    y: np.ndarray


def image_meta(m: NodeManifest) -> tuple[int, tuple[float, ...], tuple[float, ...]]:
    """(num_classes, mean, std) from an ``images-npz`` manifest, checked."""
    try:
        num_classes = int(m.meta["num_classes"])
        mean = tuple(float(v) for v in m.meta["mean"])
        std = tuple(float(v) for v in m.meta["std"])
    except (KeyError, TypeError, ValueError) as exc:
        raise m.fail(m.root / MANIFEST, f"images-npz needs num_classes (int), mean and std (lists of floats) "
                                        f"({one_line(exc)})") from None
    if num_classes < 2 or not mean or len(mean) != len(std) or min(std) <= 0:
        raise m.fail(m.root / MANIFEST, f"num_classes must be >= 2 and mean/std one value per channel with "
                                        f"std > 0, got {num_classes}, {mean}, {std}")
    return num_classes, mean, std


def _plain_fail(where: str | Path, problem: str) -> NodeDataError:
    return NodeDataError(f"{where}: {problem}")


def check_images(x: np.ndarray, y: np.ndarray, num_classes: int, where: str | Path,
                 fail: Callable[[str | Path, str], Exception] = _plain_fail) -> ImageClient:
    """Check the shapes, dtypes and label range of one client's images; returns them as stored.

    ``fail(where, problem)`` builds the exception (a manifest's :meth:`NodeManifest.fail` names the node).
    """
    bad = lambda problem: fail(where, problem)

    if x.dtype != np.uint8 or x.ndim not in (3, 4):
        raise bad(f"x must be uint8 images (n, H, W) or (n, H, W, C), got {x.dtype} {x.shape}")
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise bad(f"y must be a 1-D array of integer labels, got {y.dtype} {y.shape}")
    if len(x) != len(y) or len(x) == 0:
        raise bad(f"x has {len(x)} images and y {len(y)} labels; need the same number, at least 1")
    if y.min() < 0 or y.max() >= num_classes:
        raise bad(f"labels must lie in [0, {num_classes - 1}], got {int(y.min())}..{int(y.max())}")
    return ImageClient(x, y.astype(np.int64))


def _load_npz(path: Path, fail) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as f:
            missing = [k for k in ("x", "y") if k not in f.files]
            if missing:
                raise fail(path, f"missing array(s) {missing}; expected x (uint8 images) and y (labels), "
                                 f"found {sorted(f.files)}")
            return f["x"], f["y"]
    except FileNotFoundError:
        raise fail(path, "missing (listed in node.json)") from None
    except (OSError, ValueError, EOFError) as exc:  # not a zip, truncated, pickled objects
        raise fail(path, f"not a readable .npz ({one_line(exc)})") from exc


def read_image_clients(m: NodeManifest) -> dict[int, ImageClient]:
    """Every client's images of an ``images-npz`` node, checked (shapes equal across clients)."""
    num_classes, mean, _ = image_meta(m)
    out = {cid: check_images(*_load_npz(p, m.fail), num_classes, p, m.fail) for cid, p in m.clients.items()}
    shapes = {c.x.shape[1:] for c in out.values()}
    if len(shapes) > 1:
        raise m.fail(m.root, f"clients' images differ in shape: {sorted(shapes)}")
    channels = 1 if len(next(iter(shapes))) == 2 else next(iter(shapes))[2]
    if channels != len(mean):
        raise m.fail(m.root / MANIFEST, f"mean/std have {len(mean)} channel(s), the images {channels}")
    return out


def read_eval_set(path: str | Path) -> tuple[ImageClient, int, tuple[float, ...], tuple[float, ...]]:
    """The coordinator's held-out set: an ``.npz`` with x, y, num_classes, mean, std (see the export)."""
    p = Path(path)

    def fail(where, problem):
        return NodeDataError(f"coordinator eval-data-path {where}: {problem}")

    if not p.is_file():
        raise fail(p, "missing; expected the .npz written by `python -m deploy.export` "
                      "(coordinator/<study>/eval.npz) with x, y, num_classes, mean and std")
    x, y = _load_npz(p, fail)
    with np.load(p, allow_pickle=False) as f:
        missing = [k for k in ("num_classes", "mean", "std") if k not in f.files]
        if missing:
            raise fail(p, f"missing array(s) {missing}")
        num_classes, mean, std = int(f["num_classes"]), tuple(map(float, f["mean"])), tuple(map(float, f["std"]))
    return check_images(x, y, num_classes, p, fail), num_classes, mean, std


# ----------------------------------------------------------------------------- cancer-csv / busi-folder
def read_table_clients(m: NodeManifest):
    """Every client's validated table of a ``cancer-csv`` node (:func:`datasets.cancer.load_cancer_csv`)."""
    from datasets.cancer import load_cancer_csv

    out = {}
    for cid, p in m.clients.items():
        if not p.is_file():
            raise m.fail(p, "missing (listed in node.json); expected the node's patient CSV")
        try:
            out[cid] = load_cancer_csv(p)
        except DataError as exc:  # its message already names the file and the column
            raise NodeDataError(f"{m.node}: {one_line(exc)}") from exc
    return out


def read_busi_folder(folder: Path, fail: Callable[[str | Path, str], Exception] = _plain_fail):
    """One client's BUSI-layout folder as :class:`datasets.busi.UltrasoundImages`, in training order.

    The layout of :func:`datasets.busi.load_busi` (``benign/``, ``malignant/``, ``normal/``, PNGs,
    ``*_mask*`` files ignored), except that a class folder may be empty: one institution's patients
    need not cover every class. Order: the export names a client's images ``<position>.png`` (its
    position in the simulated partition), so a node trains them in the simulation's order; other
    names train class by class, sorted by name.
    """
    import cv2

    from datasets.busi import BUSI_CLASSES, UltrasoundImages, is_mask_file

    missing = [c for c in BUSI_CLASSES if not (folder / c).is_dir()]
    if missing:
        raise fail(folder, f"class folder(s) {missing} missing; expected {list(BUSI_CLASSES)} (the BUSI layout)")
    files = [(p, k) for k, c in enumerate(BUSI_CLASSES) for p in sorted((folder / c).iterdir())
             if p.suffix.lower() == ".png" and not is_mask_file(p)]
    if not files:
        raise fail(folder, f"no PNG images in {list(BUSI_CLASSES)}")
    if all(p.stem.isdigit() for p, _ in files):
        files.sort(key=lambda pk: int(pk[0].stem))
    images = []
    for p, _ in files:
        img = cv2.imread(str(p), cv2.IMREAD_GRAYSCALE)
        if img is None:
            raise fail(p, "could not decode the PNG")
        images.append(img)
    return UltrasoundImages("busi", images, np.asarray([k for _, k in files], dtype=np.int64), BUSI_CLASSES,
                            str(folder), False, [f"node-local BUSI folder {folder}: {len(images)} images"])


def read_busi_clients(m: NodeManifest):
    """Every client's BUSI-layout folder of a ``busi-folder`` node (:func:`read_busi_folder`)."""
    out = {}
    for cid, p in m.clients.items():
        if not p.is_dir():
            raise m.fail(p, "missing (listed in node.json); expected a folder with benign/, malignant/, normal/")
        out[cid] = read_busi_folder(p, m.fail)
    return out


# ----------------------------------------------------------------------------- writing (export)
def write_atomic(path: Path, write) -> None:
    """Write through ``write(fh)`` into a temp file next to ``path``, then rename (never half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_manifest(root: str | Path, fmt: str, clients: Mapping[int, str], node: str = "", **meta: Any) -> Path:
    """Write ``node.json`` (written last by the writers below: a folder with a manifest is complete)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    body = {"format": fmt, "node": node, "clients": {str(c): r for c, r in sorted(clients.items())}, **meta}
    path = Path(root) / MANIFEST
    write_atomic(path, lambda fh: fh.write((json.dumps(body, indent=1) + "\n").encode()))
    return path


def write_npz(path: str | Path, **arrays: np.ndarray) -> Path:
    """An uncompressed ``.npz``, written atomically."""
    p = Path(path)
    # numpy's stub types savez's **kwds after its allow_pickle: bool, so **dict[str, ndarray] does not match
    write_atomic(p, lambda fh: np.savez(fh, **arrays))  # type: ignore[arg-type]
    return p


def write_image_node(root: str | Path, clients: Mapping[int, tuple[np.ndarray, np.ndarray]], num_classes: int,
                     mean: tuple[float, ...], std: tuple[float, ...], node: str = "") -> Path:
    """An ``images-npz`` node folder: ``client-<id>.npz`` (x uint8, y int64) per client, then node.json."""
    root = Path(root)
    files = {}
    for cid, (x, y) in clients.items():
        check_images(np.asarray(x), np.asarray(y), num_classes, f"client {cid}")
        files[cid] = write_npz(root / f"client-{cid}.npz", x=np.asarray(x), y=np.asarray(y, np.int64)).name
    return write_manifest(root, "images-npz", files, node, num_classes=int(num_classes),
                          mean=[float(v) for v in mean], std=[float(v) for v in std])


def write_table_node(root: str | Path, clients: Mapping[int, Any], node: str = "") -> Path:
    """A ``cancer-csv`` node folder: ``client-<id>.csv`` per client (a DataFrame), then node.json."""
    root = Path(root)
    files = {}
    for cid, df in clients.items():
        name = f"client-{cid}.csv"
        write_atomic(root / name, lambda fh, df=df: fh.write(df.to_csv(index=False).encode()))
        files[cid] = name
    return write_manifest(root, "cancer-csv", files, node)


def write_busi_folder(root: str | Path, images, labels: np.ndarray, indices, class_names) -> Path:
    """A BUSI-layout folder: ``<class>/<position>.png`` for ``images[indices]`` (gray uint8, lossless PNG).

    ``labels`` are base BUSI labels indexing ``class_names``; the position names keep the order
    (see :func:`busi_order`). Every class folder is created, even an empty one (the layout).
    """
    import cv2

    root = Path(root)
    for name in class_names:
        (root / name).mkdir(parents=True, exist_ok=True)
    for pos, i in enumerate(np.asarray(indices, dtype=np.int64)):
        ok, buf = cv2.imencode(".png", np.asarray(images[i]))
        if not ok:
            raise ValueError(f"could not encode image {int(i)} as PNG")
        write_atomic(root / class_names[int(labels[i])] / f"{pos:05d}.png", lambda fh, b=buf: fh.write(b.tobytes()))
    return root
