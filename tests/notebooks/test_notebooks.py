"""The notebooks execute end to end (on small parameters) and draw their plots."""
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat not installed (pip install -e '.[test]')")
nbclient = pytest.importorskip("nbclient", reason="nbclient not installed (pip install -e '.[test]')")
pytest.importorskip("ipykernel", reason="ipykernel not installed (pip install -e '.[test]')")

NB_DIR = Path(__file__).resolve().parents[2] / "notebooks"


@pytest.mark.parametrize("name,min_plots", [("quickstart", 2), ("infermax_findings", 4), ("policy_zoo", 2),
                                            ("optimal_vs_heuristics", 4), ("calibrate_your_gpu", 2),
                                            ("fleet_plan", 2)])
def test_notebook_executes_and_plots(name, min_plots, monkeypatch):
    monkeypatch.setenv("SERVESIM_NB_SMALL", "1")
    nb = nbformat.read(NB_DIR / f"{name}.ipynb", as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(NB_DIR)}})
    client.execute()          # raises CellExecutionError naming the failing cell
    plots = sum(1 for cell in nb.cells if cell.cell_type == "code"
                for out in cell.get("outputs", []) if "image/png" in out.get("data", {}))
    assert plots >= min_plots
