"""The README's example app is the real file, and it trains on a cluster."""
import re

from harmony.app import load_app, run_local
from conftest import ROOT, wait_state


def test_readme_example_is_apps_minimal():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert (ROOT / "apps" / "minimal.py").read_text() in blocks


def test_minimal_app_trains_on_two_machines(client):
    src = (ROOT / "apps" / "minimal.py").read_text()
    args = ["--max-epochs", "15"]
    job = client.submit("minimal.py", src, args, machines=2)
    st = wait_state(client, job, ("finished", "failed"))
    assert st["state"] == "finished", st["error"]
    objs = [e["metrics"]["objective"] for e in st["epochs"]]
    assert objs[-1] < 1e-3 * objs[0]
    ref = run_local(load_app(src, "minimal.py"), args).history
    assert abs(objs[-1] - ref[-1]["objective"]) < 1e-4
