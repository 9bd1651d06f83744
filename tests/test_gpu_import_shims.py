"""The GPU-only import shims satisfy sglang's imports without fooling torch."""

import subprocess
import sys

CODE = r"""
from harness.target import gpu_import_shims as g
shimmed = g.install()
assert set(shimmed) == {"triton", "torchvision"}, shimmed
import triton, triton.language as tl
from torchvision.transforms import functional as TF
from torch.utils._triton import has_triton_package
assert not has_triton_package(), "torch must keep treating triton as absent"
assert g.is_shimmed("triton")

@triton.jit
def kernel(x):
    return x
assert kernel(3) == 3                     # decorator leaves the function alone
assert not isinstance(1, tl.constexpr)   # isinstance works and never matches
class Sub(triton.runtime.jit.JITFunction):  # usable as a base class
    pass
try:
    triton.language.dot.run()
except g.GpuOnlyError as e:
    assert "GPU-only" in str(e)
else:
    raise AssertionError("running a shim must raise")
assert g.install() == shimmed            # idempotent
print("OK")
"""


def test_shims_in_a_fresh_interpreter():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("OK")


DRIVER_CODE = r"""
from harness.target import gpu_import_shims as g
g.install()
import triton
driver = triton.runtime.driver          # importing and naming it is fine ...
try:
    driver.active.get_current_target()  # ... asking it for a GPU is not, as with the real triton on CPU
except RuntimeError as e:
    assert isinstance(e, g.GpuOnlyError) and "0 active drivers" in str(e), e
else:
    raise AssertionError("triton.runtime.driver.active must raise")
from transformers.utils import import_utils
# transformers >= 5.18 keeps treating torchvision as absent; older ones must find the stand-in
assert import_utils.is_torchvision_available() == g.transformers_must_see_torchvision()
print("OK")
"""

OLD_TRANSFORMERS_CODE = r"""
import importlib.metadata as md
real_version = md.version
md.version = lambda name: "5.12.1" if name == "transformers" else real_version(name)
from harness.target import gpu_import_shims as g
assert g.transformers_must_see_torchvision()
g.install()
from transformers.utils import import_utils
assert import_utils.is_torchvision_available(), "transformers < 5.18 must find the torchvision stand-in"
from torch.utils._triton import has_triton_package
assert not has_triton_package(), "torch must still treat triton as absent"
print("OK")
"""


def test_triton_driver_raises_like_the_real_one_without_a_gpu():
    out = subprocess.run([sys.executable, "-c", DRIVER_CODE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("OK")


def test_transformers_before_5_18_sees_the_torchvision_stand_in():
    """sglang 0.5.17 pins transformers 5.12.1, whose AutoImageProcessor is a
    torchvision-only dummy unless torchvision is found (gpu_import_shims)."""
    out = subprocess.run([sys.executable, "-c", OLD_TRANSFORMERS_CODE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("OK")


def test_which_transformers_releases_must_see_torchvision(monkeypatch):
    import importlib.metadata as md

    from harness.target import gpu_import_shims as g

    for version, must in (("5.12.1", True), ("5.17.0", True), ("5.18.0", False), ("5.19.0", False)):
        monkeypatch.setattr(md, "version", lambda name, v=version: v)
        assert g.transformers_must_see_torchvision() is must, version
