"""Expert backends: built-in classes, validation, training steps, checkpoints, custom classes."""

from __future__ import annotations

import copy
import os
import textwrap

import pytest
import torch

from volunteer.errors import ExpertConfigError, ExpertInputError, ExpertProtocolError
from volunteer.experts import ExpertsConfig, TensorSpec, expert_classes, get_expert_class, load_expert_file
from volunteer.experts.backend import ExpertBackend, make_backend, resolve_device
from volunteer.experts.checkpoints import read_checkpoint
from volunteer.experts.layers import default_heads


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_builtin_classes_and_shapes():
    assert {"ffn", "transformer"} <= set(expert_classes())
    ffn = make_backend("ffn.0", "ffn", 32)
    assert [s.shape for s in ffn.inputs] == [(32,)] and [s.shape for s in ffn.outputs] == [(32,)]
    (y,) = ffn.forward([torch.randn(5, 32)])
    assert y.shape == (5, 32) and not y.requires_grad and y.device.type == "cpu"
    block = make_backend("transformer.0", "transformer", 64)
    for length in (1, 7):
        (y,) = block.forward([torch.randn(3, length, 64)])
        assert y.shape == (3, length, 64)
    assert default_heads(64) == 1 and default_heads(256) == 4 and default_heads(96) == 1 and default_heads(384) == 6


def test_device_auto_is_cpu_without_cuda():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert make_backend("ffn.0", "ffn", 8).device.type == expected
    with pytest.raises(ExpertConfigError):
        resolve_device("warp-drive")


def test_validation_errors_are_clear():
    backend = make_backend("ffn.0", "ffn", 16)
    cases = [
        ([], "expected 1 input"),
        ([torch.randn(4, 15)], r"got float32\[4, 15\], expected float32\[batch, 16\]"),
        ([torch.randn(4, 16, dtype=torch.float64)], "float64"),
        ([torch.randn(16)], r"expected float32\[batch, 16\]"),
        ([torch.randn(0, 16)], "at least one sample"),
        ([torch.full((2, 16), float("nan"))], "NaN"),
        ([torch.full((2, 16), float("inf"))], "NaN or inf"),
        (["not a tensor"], "expected a tensor"),
        ([torch.randn(1025, 16)], "at most 1024"),
    ]
    for inputs, message in cases:
        with pytest.raises(ExpertInputError, match=message):
            backend.forward(inputs)
    with pytest.raises(ExpertInputError, match="batch size"):
        backend.backward([torch.randn(4, 16)], [torch.randn(3, 16)])
    with pytest.raises(ExpertInputError, match="gradient 0 holds NaN"):
        backend.backward([torch.randn(4, 16)], [torch.full((4, 16), float("nan"))])
    relaxed = make_backend("ffn.1", "ffn", 16, config=ExpertsConfig(nan_check=False))
    relaxed.forward([torch.full((2, 16), float("nan"))])  # allowed when the check is off


def test_backward_matches_autograd_and_steps_the_optimizer():
    backend = make_backend("ffn.0", "ffn", 16)
    reference = copy.deepcopy(backend.module)
    x, grad = torch.randn(6, 16), torch.randn(6, 16)
    leaf = x.to(backend.device).clone().requires_grad_(True)  # the reference runs where the expert does
    reference(leaf).backward(grad.to(backend.device))
    before = [p.detach().clone() for p in backend.module.parameters()]
    (grad_x,) = backend.backward([x], [grad])
    assert torch.allclose(grad_x, leaf.grad.cpu(), atol=1e-5)
    assert backend.updates == 1
    assert all(not torch.equal(a, b) for a, b in zip(before, backend.module.parameters()))
    assert all(p.grad is None for p in backend.module.parameters())  # zeroed after the step


def test_failed_backward_changes_nothing():
    backend = make_backend("transformer.0", "transformer", 16)
    before = copy.deepcopy(backend.module.state_dict())
    with pytest.raises(ExpertInputError, match="gradient 0 has shape"):
        backend.backward([torch.randn(2, 5, 16)], [torch.randn(2, 4, 16)])  # free size disagrees
    assert backend.updates == 0
    assert all(torch.equal(before[k], v) for k, v in backend.module.state_dict().items())


def test_integer_inputs_get_zero_gradients(tmp_path):
    path = tmp_path / "embed.py"
    path.write_text(
        textwrap.dedent(
            """
            import torch
            from volunteer.experts import TensorSpec, register_expert

            @register_expert("test_scaled_embed", inputs=lambda h: [TensorSpec((h,)), TensorSpec((), torch.int64)])
            class Scaled(torch.nn.Module):
                def __init__(self, hidden_dim):
                    super().__init__()
                    self.table = torch.nn.Embedding(10, hidden_dim)
                def forward(self, x, ids):
                    return x * self.table(ids)
            """
        )
    )
    assert load_expert_file(path) == ["test_scaled_embed"]
    backend = make_backend("emb.0", "test_scaled_embed", 4)
    grads = backend.backward([torch.randn(3, 4), torch.tensor([1, 2, 3])], [torch.ones(3, 4)])
    assert grads[1].dtype == torch.int64 and torch.equal(grads[1], torch.zeros(3, dtype=torch.int64))


def _train(backend: ExpertBackend, steps: int) -> None:
    for _ in range(steps):
        backend.backward([torch.randn(4, 8)], [torch.randn(4, 8)])


def test_checkpoint_round_trip_and_restart_continues(tmp_path):
    config = ExpertsConfig(checkpoint_every=3)
    backend = make_backend("ffn.5", "ffn", 8, config=config, checkpoint_dir=tmp_path)
    _train(backend, 4)  # a checkpoint at 3 updates, not yet at 4
    assert backend.updates == 4 and backend.dirty
    saved = read_checkpoint(tmp_path / "ffn.5.pt")
    assert saved["updates"] == 3
    backend.save_checkpoint()  # what the runtime does on shutdown
    assert not backend.dirty
    # no temporary files left behind; the generation before is kept
    assert sorted(os.listdir(tmp_path)) == ["ffn.5.pt", "ffn.5.pt.prev"]

    restarted = make_backend("ffn.5", "ffn", 8, config=config, checkpoint_dir=tmp_path)
    assert restarted.updates == 4
    for (name, a), b in zip(backend.module.state_dict().items(), restarted.module.state_dict().values()):
        assert torch.equal(a, b), name
    state_a, state_b = backend.optimizer.state_dict()["state"], restarted.optimizer.state_dict()["state"]
    assert all(torch.equal(state_a[k]["exp_avg"], state_b[k]["exp_avg"]) for k in state_a)
    # Same next step on both: identical weights afterwards (optimizer state restored too).
    x, g = torch.randn(4, 8), torch.randn(4, 8)
    backend.backward([x], [g])
    restarted.backward([x], [g])
    assert restarted.updates == 5
    assert all(torch.equal(a, b) for a, b in zip(backend.module.parameters(), restarted.module.parameters()))


def test_checkpoint_of_another_expert_is_refused(tmp_path):
    make_backend("ffn.1", "ffn", 8, checkpoint_dir=tmp_path).save_checkpoint()
    os.replace(tmp_path / "ffn.1.pt", tmp_path / "ffn.2.pt")
    with pytest.raises(ExpertConfigError, match="hidden_dim"):
        make_backend("ffn.2", "ffn", 16, checkpoint_dir=tmp_path)
    (tmp_path / "ffn.3.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ExpertConfigError, match="cannot read"):
        make_backend("ffn.3", "ffn", 8, checkpoint_dir=tmp_path)


def test_unsafe_uids_and_classes_are_refused():
    with pytest.raises(ExpertConfigError):
        make_backend("../evil", "ffn", 8)
    with pytest.raises(ExpertConfigError, match="unknown expert class"):
        make_backend("x.0", "no_such_class", 8)
    with pytest.raises(ExpertConfigError, match="hidden_dim"):
        make_backend("x.0", "ffn", 0)


def test_custom_class_from_file_and_reload(tmp_path):
    path = tmp_path / "my_experts.py"
    source = """
        import dataclasses
        import torch
        import volunteer.experts

        @dataclasses.dataclass  # needs the module in sys.modules while it runs
        class Settings:
            width: int = 1

        @volunteer.experts.register_expert("test_gated")
        class Gated(torch.nn.Module):
            def __init__(self, hidden_dim):
                super().__init__()
                self.gate = torch.nn.Linear(hidden_dim, hidden_dim)
            def forward(self, x):
                return x * torch.sigmoid(self.gate(x)) * SCALE

        SCALE = {scale}
        """
    path.write_text(textwrap.dedent(source.format(scale=1.0)))
    assert load_expert_file(path) == ["test_gated"]
    backend = make_backend("gated.0", "test_gated", 6)
    assert backend.outputs == [TensorSpec((6,))]  # found by a dummy forward
    x = torch.randn(2, 6)
    assert backend.forward([x])[0].shape == (2, 6)
    assert get_expert_class("test_gated").source == str(path)
    path.write_text(textwrap.dedent(source.format(scale=2.0)))
    assert load_expert_file(path) == ["test_gated"]  # reloading its own file replaces the class

    other = tmp_path / "other.py"
    other.write_text(path.read_text())
    with pytest.raises(ExpertConfigError, match="already registered"):
        load_expert_file(other)
    assert get_expert_class("test_gated").source == str(path)  # the failed load left it alone


@pytest.mark.parametrize(
    "text,message",
    [
        ("x = 1\n", "registers no expert"),
        ("raise RuntimeError('boom')\n", "boom"),
        ("import volunteer.experts as e\n@e.register_expert('bad name!')\nclass X: pass\n", "bad name"),
    ],
)
def test_bad_custom_files(tmp_path, text, message):
    path = tmp_path / "bad.py"
    path.write_text(text)
    with pytest.raises(ExpertConfigError, match=message):
        load_expert_file(path)
    with pytest.raises(ExpertConfigError, match="does not exist"):
        load_expert_file(tmp_path / "missing.py")


def test_free_sizes_need_explicit_outputs():
    with pytest.raises(ExpertConfigError, match="explicit outputs"):
        ExpertBackend("seq.0", torch.nn.Identity(), inputs=[TensorSpec((None, 4))])


def test_schema_round_trip_and_info():
    spec = TensorSpec((None, 8), torch.bfloat16)
    assert TensorSpec.from_dict(spec.to_dict()) == spec
    for bad in ({"s": [1], "d": "f32"}, {"s": [-1], "d": "float32"}, {"s": "ab", "d": "float32"}, [], {"s": [1]}):
        with pytest.raises(ExpertProtocolError):
            TensorSpec.from_dict(bad)
    info = make_backend("transformer.1", "transformer", 8).info()
    assert info["inputs"] == [{"s": [None, 8], "d": "float32"}] and info["class"] == "transformer"
    assert info["updates"] == 0 and info["hidden_dim"] == 8
