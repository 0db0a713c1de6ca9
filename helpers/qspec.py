"""One weight-quantization spec, validated once at the door and passed down unchanged.

``QuantSpec(bits, group_size, symmetric)`` says what every quantizer of the course (RTN, GPTQ, AWQ,
the llm-compressor bridge, the variant store) produces:

* ``bits`` — code width, one of :data:`SUPPORTED_BITS`;
* ``group_size`` — consecutive input columns sharing one (scale, zero); ``None`` means one pair per
  output channel (row of ``W[out, in]``). ``0`` and negative sizes are refused, not reinterpreted;
* ``symmetric`` — zero point fixed at 0 (codes ``[−2^(b−1), 2^(b−1)−1]``) or asymmetric
  (codes ``[0, 2^b−1]`` with an integer zero point).

It mirrors compressed-tensors' ``QuantizationArgs`` (``num_bits``, ``strategy`` =
``group``/``channel``, ``group_size``, ``symmetric``), which :func:`QuantSpec.to_llmcompressor` builds.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

# as_int and positive_int are the course's shared door checks (helpers.validate); importable from here too
from .validate import as_int, positive_int

__all__ = ["SUPPORTED_BITS", "QuantSpec", "allowed_group_sizes", "as_int", "check_bits", "check_group_size",
           "positive_int"]

SUPPORTED_BITS = (2, 3, 4, 8)


def check_bits(bits) -> int:
    """``bits`` as an int among :data:`SUPPORTED_BITS`, or a clear error."""
    b = as_int(bits, "bits")
    if b not in SUPPORTED_BITS:
        raise ValueError(f"unsupported bit width bits={b}; supported: {SUPPORTED_BITS}")
    return b


def check_group_size(group_size) -> int | None:
    """``None`` (per channel) or a positive int; 0 and negatives are errors, never 'per channel'."""
    if group_size is None:
        return None
    g = as_int(group_size, "group_size")
    if g <= 0:
        raise ValueError(f"group_size must be a positive number of columns or None (one scale per "
                         f"output channel), got {g}")
    return g


def allowed_group_sizes(columns: int, candidates=(16, 32, 64, 128, 256)) -> list[int]:
    """Group sizes among common choices that divide ``columns``."""
    columns = positive_int(columns, "columns", "the weight's number of input columns")
    sizes = [positive_int(g, "candidates", "group sizes are positive integers") for g in candidates]
    return [g for g in sizes if columns % g == 0]


@dataclass(frozen=True)
class QuantSpec:
    """A validated weight-quantization spec (see the module docstring)."""
    bits: int = 4
    group_size: int | None = 64
    symmetric: bool = False

    def __post_init__(self):
        object.__setattr__(self, "bits", check_bits(self.bits))
        object.__setattr__(self, "group_size", check_group_size(self.group_size))
        if not isinstance(self.symmetric, bool):
            raise TypeError(f"symmetric must be True or False, got {self.symmetric!r}")

    @classmethod
    def of(cls, spec: QuantSpec | None = None, **kw) -> QuantSpec:
        """``spec`` itself, or a spec built from keyword arguments (``bits``, ``group_size``,
        ``symmetric``); giving both is an error, so no argument is silently ignored."""
        unknown = sorted(set(kw) - {f.name for f in fields(cls)})
        if unknown:
            raise TypeError(f"unknown keyword(s) {unknown}: a QuantSpec takes bits=, group_size= and symmetric=")
        if spec is None:
            return cls(**kw)
        if not isinstance(spec, QuantSpec):
            raise TypeError(f"spec must be a QuantSpec, got {type(spec).__name__}")
        if kw:
            raise TypeError(f"give either spec= or {sorted(kw)}, not both")
        return spec

    @property
    def granularity(self) -> str:
        """``"group"`` or ``"channel"`` (the grid quantizer's name for ``group_size=None``)."""
        return "channel" if self.group_size is None else "group"

    def group_for(self, columns: int) -> int:
        """Columns per (scale, zero) for a weight with ``columns`` inputs; the group must divide them."""
        columns = positive_int(columns, "columns", "the weight's number of input columns")
        if self.group_size is None:
            return columns
        if columns % self.group_size:
            raise ValueError(f"group_size={self.group_size} does not divide the {columns} input columns; "
                             f"allowed group sizes: {allowed_group_sizes(columns)}")
        return self.group_size

    @property
    def label(self) -> str:
        """``w4g64``, ``w8ch``, ``w4g128s`` (s = symmetric): used in variant keys and tables."""
        return f"w{self.bits}{'ch' if self.group_size is None else f'g{self.group_size}'}" + \
            ("s" if self.symmetric else "")

    def to_llmcompressor(self):
        """The same spec as a compressed-tensors ``QuantizationScheme`` (weights only, Linear targets)."""
        # optional heavy dependency (with llmcompressor): imported only when a scheme is asked for
        from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

        args = QuantizationArgs(num_bits=self.bits, type="int", symmetric=self.symmetric,
                                strategy=self.granularity, group_size=self.group_size)
        return QuantizationScheme(targets=["Linear"], weights=args)
