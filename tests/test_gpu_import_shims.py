"""The GPU-only import shims satisfy sglang's imports without fooling torch."""

import subprocess
import sys

CODE = r"""
from harness import gpu_import_shims as g
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
