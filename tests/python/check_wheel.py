"""check_wheel.py — the installed flashinfer_c package, as pip put it
(`pip install ./python`), without torch and outside the source tree: the
library it loads is the copy inside the package, its declared dependencies
are importable, and a bf16 decode of numpy arrays (ml_dtypes) matches
attention computed here in float64.

    python tests/python/check_wheel.py      # .ci/run, after the README's pip line
"""

import importlib.metadata
import os
import sys
from pathlib import Path

# Import the installed package: never the checkout's python/ (this file's
# folder and the current directory come first on sys.path otherwise).
here = Path(__file__).resolve().parent
sys.path = [p for p in sys.path if p and Path(p).resolve() not in (here, Path.cwd().resolve())]
os.environ.pop("FLASHINFER_C_LIB", None)

import ml_dtypes  # noqa: E402  (a declared dependency: bf16/FP8 numpy arrays)
import numpy as np  # noqa: E402

import flashinfer_c  # noqa: E402

package = Path(flashinfer_c.__file__).resolve().parent
library = Path(flashinfer_c.library_path).resolve()
assert library.parent == package / "_lib", f"loaded {library}, not the copy in {package}/_lib"
requires = importlib.metadata.requires("flashinfer-c") or []
for name in ("numpy", "ml_dtypes"):
    assert any(r.replace("-", "_").startswith(name) for r in requires), f"{name} not declared: {requires}"
assert any("torch" in r and "extra" in r for r in requires), f"no torch extra: {requires}"

rng = np.random.default_rng(0)
heads, kv_heads, dim, kv_len = 8, 2, 128, 300
q = rng.uniform(-1, 1, (heads, dim)).astype(ml_dtypes.bfloat16)
k = rng.uniform(-1, 1, (kv_len, kv_heads, dim)).astype(ml_dtypes.bfloat16)
v = rng.uniform(-1, 1, (kv_len, kv_heads, dim)).astype(ml_dtypes.bfloat16)
out = flashinfer_c.single_decode_with_kv_cache(q, k, v)

# float64 attention of the same bf16 values; query head h reads KV head
# h // (heads // kv_heads)
qf, kf, vf = (x.astype(np.float64) for x in (q, k, v))
kh = np.arange(heads) // (heads // kv_heads)
s = np.einsum("hd,nhd->hn", qf, kf[:, kh]) / np.sqrt(dim)
p = np.exp(s - s.max(axis=1, keepdims=True))
ref = np.einsum("hn,nhd->hd", p / p.sum(axis=1, keepdims=True), vf[:, kh])
err = np.abs(out.astype(np.float64) - ref).max()
assert out.dtype == ml_dtypes.bfloat16 and out.shape == (heads, dim), (out.dtype, out.shape)
assert err < 2e-2, f"max |err| {err}"
print(f"check_wheel: flashinfer_c {flashinfer_c.__version__} from {package}, library {library.name}"
      f" inside it; bf16 decode (numpy + ml_dtypes) max |err| {err:.1e}: ok")
