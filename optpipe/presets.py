"""Model and hardware presets: the TOML files under ``models/`` and ``models/hardware/``.

A preset is data with a citation, not code: every figure in a preset file names where
it comes from (a paper table, a Hugging Face ``config.json``, a vendor datasheet). This
module only finds, reads and checks those files; the arithmetic that turns them into a
:class:`~optpipe.problem.Problem` lives in :mod:`optpipe.costmodel`.

Where presets are looked for, in order:

1. ``<installed optpipe>/_data/models`` — a wheel built by the project's ``pyproject``
   carries the repository's ``models/`` folder there (hatch ``force-include``), so a
   plain, non-editable ``pip install .`` finds the presets from any working directory;
2. ``<repository>/models`` — a source checkout (tests, editable installs).

A name that ends in ``.toml`` or contains a path separator is read as a path to a
user's own preset instead.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from optpipe.errors import OptPipeError
from optpipe.units import parse_bandwidth, parse_bytes, parse_seconds

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

_PACKAGE_DIR = Path(__file__).resolve().parent


def model_dirs() -> list[Path]:
    """Folders searched for model presets, installed data first, then the checkout.

    The checkout's ``models/`` counts only next to a ``pyproject.toml``: installed,
    the package's parent is ``site-packages``, where another distribution's top-level
    ``models`` folder must not be mistaken for ours.
    """
    dirs = [_PACKAGE_DIR / "_data" / "models"]
    if (_PACKAGE_DIR.parent / "pyproject.toml").is_file():
        dirs.append(_PACKAGE_DIR.parent / "models")
    return dirs


def hardware_dirs() -> list[Path]:
    """Folders searched for hardware presets (``hardware/`` under each model folder)."""
    return [d / "hardware" for d in model_dirs()]


# ----------------------------------------------------------------------- schemas
@dataclass(frozen=True)
class ModelPreset:
    """A transformer architecture, enough to count its FLOPs, bytes and parameters.

    ``kv_heads < heads`` means grouped-query attention; ``gated_mlp`` means the MLP has
    a gate and an up projection (SwiGLU when ``activation == "silu"``); ``dropout`` is
    the probability used everywhere dropout applies (0 means no dropout and so no
    stored masks). ``seq_len`` is the sequence length a run uses when it names none:
    the cited source's, unless the preset file says why not. ``vocab_pad_multiple`` follows Megatron-LM, which pads the
    vocabulary to a multiple of this times the tensor-parallel degree.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int
    seq_len: int
    activation: str = "gelu"
    gated_mlp: bool = False
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    position: str = "learned"
    tied_embeddings: bool = True
    bias: bool = True
    dropout: float = 0.0
    vocab_pad_multiple: int = 128
    source: str = ""
    description: str = ""

    @property
    def head_dim(self) -> int:
        """Width of one attention head (hidden / heads)."""
        return self.hidden // self.heads

    @property
    def kv_width(self) -> int:
        """Width of the K (and of the V) projection: kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    def check(self) -> None:
        """Reject architectures the cost model cannot count, naming the field."""
        for key in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab",
                    "seq_len", "vocab_pad_multiple"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise OptPipeError(f"model {self.name!r}: '{key}' must be a positive "
                                   f"integer, got {value!r}")
        if self.hidden % self.heads:
            raise OptPipeError(f"model {self.name!r}: hidden ({self.hidden}) must be a "
                               f"multiple of heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise OptPipeError(f"model {self.name!r}: heads ({self.heads}) must be a "
                               f"multiple of kv_heads ({self.kv_heads})")
        choices = {"activation": ("gelu", "relu", "silu"),
                   "norm": ("layernorm", "rmsnorm"),
                   "position": ("learned", "rope")}
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise OptPipeError(f"model {self.name!r}: '{key}' must be one of "
                                   f"{list(allowed)}, got {getattr(self, key)!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise OptPipeError(f"model {self.name!r}: 'dropout' must be in [0, 1), "
                               f"got {self.dropout!r}")


@dataclass(frozen=True)
class HardwarePreset:
    """One accelerator and its links. FLOP/s, bytes, bytes/s and seconds.

    ``peak_flops`` is the dense (no sparsity) bf16 tensor-core peak; ``memory`` the
    device memory; ``d2h_bandwidth``/``h2d_bandwidth`` the host link per direction
    (activation offload); ``p2p_bandwidth``/``p2p_latency`` the intra-node link used
    for pipeline sends between neighbouring stages, per direction.
    """

    name: str
    peak_flops: float
    memory: int
    d2h_bandwidth: float
    h2d_bandwidth: float
    p2p_bandwidth: float
    p2p_latency: float
    source: str = ""
    description: str = ""


_MODEL_REQUIRED = ("layers", "hidden", "heads", "ffn_hidden", "vocab", "seq_len")
_MODEL_KEYS = {f.name for f in fields(ModelPreset)} | {"notes", "url"}
_HW_REQUIRED = ("peak_bf16_tflops", "memory", "d2h_bandwidth", "h2d_bandwidth",
                "p2p_bandwidth", "p2p_latency")
_HW_KEYS = set(_HW_REQUIRED) | {"name", "source", "description", "notes", "url"}


# ----------------------------------------------------------------------- reading
def _read_toml(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise OptPipeError(f"preset file {str(path)!r} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise OptPipeError(f"cannot read preset file {str(path)!r}: {exc}") from None
    return data


def _listing(dirs: list[Path]) -> dict[str, Path]:
    """Preset name -> file; a name found in an earlier folder hides later ones."""
    found: dict[str, Path] = {}
    for folder in dirs:
        if folder.is_dir():
            for path in sorted(folder.glob("*.toml")):
                found.setdefault(path.stem, path)
    return found


def _is_path(name: str) -> bool:
    return name.lower().endswith(".toml") or "/" in name or "\\" in name


def _locate(name: str, dirs: list[Path], kind: str) -> Path:
    if not isinstance(name, str) or not name.strip():
        raise OptPipeError(f"a {kind} preset needs a name or a path, got {name!r}")
    if _is_path(name):
        path = Path(name).expanduser()
        if not path.is_file():
            raise OptPipeError(f"{kind} preset file {name!r} does not exist")
        return path
    known = _listing(dirs)
    if name not in known:
        raise OptPipeError(f"unknown {kind} {name!r}; known {kind}s: "
                           f"{', '.join(sorted(known)) or '(none found)'}; or give a "
                           f"path to a .toml file")
    return known[name]


def list_models() -> list[str]:
    """Names of the model presets that ship with optpipe, sorted."""
    return sorted(_listing(model_dirs()))


def list_hardware() -> list[str]:
    """Names of the hardware presets that ship with optpipe, sorted."""
    return sorted(_listing(hardware_dirs()))


def load_model_preset(name: str) -> ModelPreset:
    """Read a model preset by name (``gpt3-1.3b``) or by path to a TOML file."""
    path = _locate(name, model_dirs(), "model")
    data = _read_toml(path)
    where = f"model preset {str(path)!r}"
    unknown = set(data) - _MODEL_KEYS
    if unknown:
        raise OptPipeError(f"{where}: unknown key(s) {sorted(unknown)}; known keys: "
                           f"{sorted(_MODEL_KEYS)}")
    missing = [k for k in _MODEL_REQUIRED if k not in data]
    if missing:
        raise OptPipeError(f"{where}: missing key(s) {missing}, e.g. layers = 24")
    values = {k: v for k, v in data.items() if k not in ("notes", "url")}
    values.setdefault("name", path.stem)
    values.setdefault("kv_heads", values["heads"])
    if "url" in data and data["url"] not in values.get("source", ""):
        values["source"] = f"{values.get('source', '')} {data['url']}".strip()
    try:
        values["dropout"] = float(values.get("dropout", 0.0))
        values["norm_eps"] = float(values.get("norm_eps", 1e-5))
        preset = ModelPreset(**values)
    except (TypeError, ValueError) as exc:
        raise OptPipeError(f"{where}: {exc}") from None
    try:
        preset.check()
    except OptPipeError as exc:
        raise OptPipeError(f"{where}: {exc}") from None
    return preset


def load_hardware_preset(name: str) -> HardwarePreset:
    """Read a hardware preset by name (``h100-80gb``) or by path to a TOML file.

    Sizes and rates use the human units of :mod:`optpipe.units` (``"80GB"``,
    ``"450GB/s"``, ``"3us"``); ``peak_bf16_tflops`` is a plain number of TFLOP/s.
    """
    path = _locate(name, hardware_dirs(), "hardware")
    data = _read_toml(path)
    where = f"hardware preset {str(path)!r}"
    unknown = set(data) - _HW_KEYS
    if unknown:
        raise OptPipeError(f"{where}: unknown key(s) {sorted(unknown)}; known keys: "
                           f"{sorted(_HW_KEYS)}")
    missing = [k for k in _HW_REQUIRED if k not in data]
    if missing:
        raise OptPipeError(f"{where}: missing key(s) {missing}, e.g. memory = \"80GB\"")
    peak = data["peak_bf16_tflops"]
    if not isinstance(peak, (int, float)) or isinstance(peak, bool) or peak <= 0:
        raise OptPipeError(f"{where}: 'peak_bf16_tflops' must be a positive number, "
                           f"e.g. peak_bf16_tflops = 989.4")
    try:
        preset = HardwarePreset(
            name=str(data.get("name", path.stem)),
            peak_flops=float(peak) * 1e12,
            memory=parse_bytes(data["memory"], "memory"),
            d2h_bandwidth=parse_bandwidth(data["d2h_bandwidth"], "d2h_bandwidth"),
            h2d_bandwidth=parse_bandwidth(data["h2d_bandwidth"], "h2d_bandwidth"),
            p2p_bandwidth=parse_bandwidth(data["p2p_bandwidth"], "p2p_bandwidth"),
            p2p_latency=parse_seconds(data["p2p_latency"], "p2p_latency"),
            source=str(data.get("source", "")),
            description=str(data.get("description", "")),
        )
    except OptPipeError as exc:
        raise OptPipeError(f"{where}: {exc}") from None
    if preset.memory <= 0:
        raise OptPipeError(f"{where}: 'memory' must be positive, e.g. memory = \"80GB\"")
    return preset
