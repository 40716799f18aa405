"""The PyTorch app: the torch helper's row mapping (zero-copy views), and test
accuracy against the same MLP trained by a plain single-process torch loop
with the same seed and epochs (run_local and a 1-machine cluster job)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from harmony.app import load_app, run_local            # noqa: E402
from harmony.torch_helper import ModuleRows             # noqa: E402
from conftest import ROOT, wait_state                   # noqa: E402

SRC = (ROOT / "apps" / "torch_mlp.py").read_text()
APP = load_app(SRC, "torch_mlp.py")
G = APP.read_input.__globals__                          # the app module's helpers
EPOCHS, SEED = 15, 3


def plain_loop(epochs=EPOCHS, seed=SEED, hidden=128, layers=1, lr=0.05, momentum=0.9,
               batch=32):
    """The same MLP, data and optimizer in a plain torch loop (no runtime)."""
    Xtr, ytr, Xte, yte = G["digits"](0)
    net = G["make_mlp"](Xtr.shape[1], hidden, layers, 10, seed)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    X, y = torch.from_numpy(Xtr), torch.from_numpy(ytr)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(len(y), generator=g)
        for s in range(0, len(y), batch):
            idx = perm[s:s + batch]
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(net(X[idx]), y[idx]).backward()
            opt.step()
    with torch.no_grad():
        return float((net(torch.from_numpy(Xte)).argmax(1).numpy() == yte).mean())


def test_module_rows_round_trip_and_views():
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    mr = ModuleRows(net, dim=16)
    assert mr.numel == 5 * 7 + 7 + 7 * 3 + 3 and mr.num_keys == -(-mr.numel // 16)
    rows = mr.init_rows(mr.keys())
    flat = np.concatenate([p.detach().numpy().ravel() for p in net.parameters()])
    assert np.array_equal(rows.ravel()[:mr.numel], flat) and not rows.ravel()[mr.numel:].any()
    pulled = rows + 1.0
    pulled.flags.writeable = False
    mr.bind(pulled)
    w = net[0].weight
    assert np.shares_memory(w.detach().numpy(), mr._buf)      # a view, no copy
    assert np.array_equal(w.detach().numpy(), pulled.ravel()[:35].reshape(7, 5))
    with torch.no_grad():
        w += 0.5                                               # an in-place optimizer step
    d = mr.deltas(pulled)
    assert np.allclose(d.ravel()[:35], 0.5) and not d.ravel()[35:].any()
    with pytest.raises(ValueError, match="pull every key"):
        mr.bind(pulled[:1])


def test_accuracy_within_one_point_of_a_plain_torch_loop(client):
    ref = plain_loop()
    args = ["--max-epochs", str(EPOCHS), "--seed", str(SEED)]
    local = run_local(APP, args).history[-1]["test_accuracy"]
    job = client.submit("torch_mlp.py", SRC, args, machines=1)
    st = wait_state(client, job, ("finished", "failed"), timeout=180)
    assert st["state"] == "finished", st["error"]
    one = st["epochs"][-1]["metrics"]["test_accuracy"]
    print(f"test accuracy: plain loop {ref:.4f}, run_local {local:.4f}, 1 machine {one:.4f}")
    assert one == pytest.approx(local, abs=1e-9)               # the runtime changes nothing
    assert abs(local - ref) <= 0.01 + 1e-9
