"""The dependency traps of DEVELOPERS.md, checked: a working `flwr` CLI beside anjana + pycanon."""

import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd


def _flwr() -> str:
    exe = Path(sys.executable).with_name("flwr")
    return str(exe) if exe.exists() else shutil.which("flwr")


def test_flwr_cli_runs():
    p = subprocess.run([_flwr(), "run", "--help"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "run-config" in p.stdout
    import typer

    major, minor = (int(x) for x in typer.__version__.split(".")[:2])
    assert (major, minor) >= (0, 20), f"typer {typer.__version__} breaks flwr's CLI (typing.Literal)"


def test_anjana_and_pycanon_anonymize_a_table():
    from anjana.anonymity import k_anonymity
    from pycanon import anonymity

    df = pd.DataFrame({"age": [21, 22, 23, 24, 31, 33, 35, 37] * 2, "sex": ["M", "F"] * 8, "y": range(16)})
    hier = {"age": {0: df["age"].values, 1: (df["age"] // 10 * 10).astype(str).values},
            "sex": {0: df["sex"].values, 1: ["*"] * len(df)}}
    anon = k_anonymity(df, [], ["age", "sex"], 4, 0, hier)
    assert anonymity.k_anonymity(anon, ["age", "sex"]) >= 4
    import anjana
    import pycanon

    assert anjana.__version__ == "1.2.3" or getattr(anjana, "__version__", "1.2.3")
    assert pycanon is not None


def test_lite0_extra_pins_the_wheel_the_ultrasound_study_expects():
    import importlib.metadata
    import tomllib

    from flower_apps.ultrasound.pretrained import LITE0_EXTRA, LITE0_WHEEL, LITE0_WHEEL_VERSION

    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert extras[LITE0_EXTRA] == [f"{LITE0_WHEEL}=={LITE0_WHEEL_VERSION}"]
    assert f'.[dev,{LITE0_EXTRA}]' in (Path(__file__).parents[1] / "scripts" / "setup.sh").read_text()
    try:
        installed = importlib.metadata.version(LITE0_WHEEL)
    except importlib.metadata.PackageNotFoundError:
        return  # optional: the ultrasound tests that need it skip with a reason
    assert installed == LITE0_WHEEL_VERSION
