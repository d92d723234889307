"""Elementwise ops, with PyTorch's type promotion: inputs are cast to the
result type (``torch.result_type``) before the tpu-rs op runs."""

import math

import torch

from .. import _C
from .registry import kernel


def _float(dtype):
    return dtype if dtype.is_floating_point or dtype.is_complex else torch.get_default_dtype()


def run(op, inputs, attrs=None, dtype=None):
    return _C.run(op, list(inputs), attrs, dtype)[0]


def _binary(op, float_result=False):
    def k(self, other):
        dtype = torch.result_type(self, other)
        return run(op, [self, other], None, _float(dtype) if float_result else dtype)

    return k


def _with_alpha(op):
    def k(self, other, alpha=1):
        dtype = torch.result_type(self, other)
        if alpha != 1:
            other = run("mul", [other, alpha], None, dtype)
        return run(op, [self, other], None, dtype)

    return k


kernel("add.Tensor", "add.Scalar")(_with_alpha("add"))
kernel("sub.Tensor", "sub.Scalar")(_with_alpha("sub"))
kernel("mul.Tensor", "mul.Scalar")(_binary("mul"))
kernel("maximum")(_binary("maximum"))
kernel("minimum")(_binary("minimum"))
kernel("atan2")(_binary("atan2", float_result=True))
kernel("hypot")(_binary("hypot", float_result=True))
kernel("nextafter")(_binary("nextafter"))
kernel("special_zeta")(_binary("zeta", float_result=True))
kernel("igamma")(_binary("igamma", float_result=True))
kernel("igammac")(_binary("igammac", float_result=True))
for _name in (
    "chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v", "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he", "laguerre_polynomial_l",
    "legendre_polynomial_p",
):
    kernel(f"special_{_name}")(_binary(_name, float_result=True))


def _times_pow2(x, k):
    """``x * 2**k`` for an integer tensor ``k``, exact while every partial
    product stays normal: one multiply by ``2**(±2**i)`` per bit of ``|k|``
    (at most ``2**±32`` each, which every f32 and f64 represents)."""
    n = k.abs()
    for i in range(11):
        bit = torch.remainder(torch.div(n, 2**i, rounding_mode="floor"), 2) == 1
        step = min(2**i, 32)
        for _ in range(2**i // step):
            factor = torch.where(k < 0, 2.0**-step, 2.0**step).to(x.dtype)
            x = torch.where(bit, x * factor, x)
    return x


@kernel("frexp.Tensor")
def frexp(self):
    """``self = mantissa * 2**exponent`` with ``0.5 <= |mantissa| < 1``;
    zero, infinities and NaN keep their value with exponent 0. f16 and bf16
    work in f32. Subnormal inputs read as zero: the device flushes them."""
    if not self.is_floating_point():
        raise RuntimeError(f"frexp: expected a float tensor, got {self.dtype} (tpu)")
    x = self.to(torch.float32) if self.dtype in (torch.float16, torch.bfloat16) else self
    finite = torch.isfinite(x) & (x != 0)
    a = torch.where(finite, x.abs(), torch.ones_like(x))
    e = torch.floor(torch.log2(a)).to(torch.int32) + 1
    # Moving toward [0.5, 1) keeps every partial product normal.
    m = _times_pow2(a, -e)
    e = e + (m >= 1).to(torch.int32) - (m < 0.5).to(torch.int32)
    m = torch.where(m >= 1, m * 0.5, torch.where(m < 0.5, m * 2, m))
    mantissa = torch.where(finite, torch.copysign(m, x), x).to(self.dtype)
    return mantissa, torch.where(finite, e, torch.zeros_like(e))


@kernel("angle", complex=True)
def angle(self):
    """Complex inputs: the phase. Real inputs: pi below zero, else 0; NaN
    stays NaN."""
    if self.is_complex():
        return run("angle", [self])
    x = self if self.is_floating_point() else self.to(torch.get_default_dtype())
    a = torch.where(x < 0, torch.full_like(x, math.pi), torch.zeros_like(x))
    return torch.where(torch.isnan(x), x, a)
kernel("fmax")(_binary("fmax"))
kernel("fmin")(_binary("fmin"))
def _check_integer_divisor(dtype, other):
    """Integer division by the number 0 is an error, as on the CPU (a zero
    inside a divisor tensor is not read back: the device gives a value)."""
    if not dtype.is_floating_point and not isinstance(other, torch.Tensor) and other == 0:
        raise RuntimeError("ZeroDivisionError")


@kernel("remainder.Tensor", "remainder.Scalar")
def remainder(self, other):
    dtype = torch.result_type(self, other)
    _check_integer_divisor(dtype, other)
    return run("remainder", [self, other], None, dtype)
kernel("bitwise_and.Tensor", "bitwise_and.Scalar")(_binary("bitwise_and"))
kernel("bitwise_or.Tensor", "bitwise_or.Scalar")(_binary("bitwise_or"))
kernel("bitwise_xor.Tensor", "bitwise_xor.Scalar")(_binary("bitwise_xor"))


def _shift(self, other, left):
    """PyTorch's integer shifts: wrapping on the left, sign-filling
    (arithmetic) on the right; a shift by a negative count or by the width
    or more gives 0 on the left and the sign on the right."""
    dtype = torch.result_type(self, other)
    if dtype.is_floating_point or dtype == torch.bool:
        name = "lshift" if left else "rshift"
        raise RuntimeError(f'"{name}_cpu" not implemented for {dtype}')
    x = self if self.dtype == dtype else run("cast", [self], {"dtype": dtype})
    count = other if isinstance(other, torch.Tensor) else torch.tensor(other, device=self.device)
    count = count.to(device=self.device, dtype=torch.int64)
    bits = torch.iinfo(dtype).bits
    valid = (count >= 0) & (count < bits)
    count = torch.where(valid, count, 0)
    # Two powers of two, each at most 2**(bits/2), so neither overflows.
    first = count // 2
    factors = [(2 ** first).to(dtype), (2 ** (count - first)).to(dtype)]
    for factor in factors:
        x = run("mul", [x, factor], None, dtype) if left else run("rounded_div", [x, factor], {"rounding": "floor"}, dtype)
    if left:
        beyond = run("full", [], {"shape": list(x.shape), "dtype": dtype, "value": 0.0})
    else:
        beyond = run("cast", [run("lt", [self, 0], None, dtype)], {"dtype": dtype})
        beyond = run("neg", [beyond]) if dtype.is_signed else beyond
    return torch.where(valid, x, beyond)


for _names, _left in (
    (("__lshift__.Tensor", "__lshift__.Scalar", "bitwise_left_shift.Tensor", "bitwise_left_shift.Tensor_Scalar"), True),
    (("__rshift__.Tensor", "__rshift__.Scalar", "bitwise_right_shift.Tensor", "bitwise_right_shift.Tensor_Scalar"), False),
):
    kernel(*_names)(lambda self, other, _left=_left: _shift(self, other, _left))
kernel("pow.Tensor_Tensor", complex=True)(_binary("pow"))


def _pow_by_value(x, exponent):
    """``x ** exponent`` for the exponents PyTorch's CPU kernel computes
    without ``pow`` (products, square roots, reciprocals), computed the same
    way, so results match it bit for bit and skip the slow general power;
    ``None`` for any other exponent."""
    if exponent == 2:
        return run("mul", [x, x])
    if exponent == 3:
        return run("mul", [run("mul", [x, x]), x])
    if not x.dtype.is_floating_point:
        return None
    if exponent == 0.5:
        return run("sqrt", [x])
    if exponent == -0.5:
        return run("reciprocal", [run("sqrt", [x])])
    if exponent == -1:
        return run("reciprocal", [x])
    if exponent == -2:
        return run("reciprocal", [run("mul", [x, x])])
    return None


@kernel("pow.Tensor_Scalar", complex=True)
def pow_tensor_scalar(self, exponent):
    dtype = torch.result_type(self, exponent)
    if isinstance(exponent, int) and exponent < 0 and not (dtype.is_floating_point or dtype.is_complex) \
            and dtype != torch.bool:
        raise RuntimeError("Integers to negative integer powers are not allowed.")
    if isinstance(exponent, (int, float)) and not isinstance(exponent, bool):
        x = self if self.dtype == dtype else run("cast", [self], {"dtype": dtype})
        special = _pow_by_value(x, exponent)
        # The cast input serves the general power too.
        return special if special is not None else run("pow", [x, exponent], None, dtype)
    return run("pow", [self, exponent], None, dtype)


@kernel("pow.Scalar", complex=True)
def pow_scalar(self, exponent):
    return run("pow", [self, exponent], None, torch.result_type(self, exponent))


@kernel("rsub.Tensor", "rsub.Scalar")
def rsub(self, other, alpha=1):
    # other - alpha * self
    dtype = torch.result_type(self, other)
    if alpha != 1:
        self = run("mul", [self, alpha], None, dtype)
    return run("sub", [other, self], None, dtype)


def _trunc(x):
    return run("mul", [run("sign", [x]), run("floor", [run("abs", [x])])])


@kernel("div.Tensor", "div.Scalar")
def div(self, other):
    return run("div", [self, other], None, _float(torch.result_type(self, other)))


@kernel("div.Tensor_mode", "div.Scalar_mode")
def div_mode(self, other, *, rounding_mode=None):
    if rounding_mode not in (None, "trunc", "floor"):
        raise RuntimeError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '{rounding_mode}'")
    if rounding_mode is None:
        return div(self, other)
    dtype = torch.result_type(self, other)
    _check_integer_divisor(dtype, other)
    # Exact for integers; floats round the quotient of the exact remainder
    # (half types in float32, as the CPU does), never a rounded quotient.
    return run("rounded_div", [self, other], {"rounding": rounding_mode}, dtype)


@kernel("floor_divide", "floor_divide.Scalar")
def floor_divide(self, other):
    return div_mode(self, other, rounding_mode="floor")


@kernel("fmod.Tensor", "fmod.Scalar")
def fmod(self, other):
    dtype = torch.result_type(self, other)
    _check_integer_divisor(dtype, other)
    return run("fmod", [self, other], None, dtype)


# Comparisons compare in the promoted dtype (and give bool).
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    kernel(f"{_name}.Tensor", f"{_name}.Scalar")(_binary(_name))


def _logical(op):
    def k(self, other):
        return run(op, [self, other], None, torch.bool)

    return k


for _name in ("logical_and", "logical_or", "logical_xor"):
    kernel(_name)(_logical(_name))


# Unary ops that keep the dtype.
for _name in ("abs", "neg", "relu", "isnan", "isinf", "logical_not"):
    kernel(_name)(lambda self, _op=_name: run(_op, [self]))


@kernel("sgn", complex=True)
def sgn(self):
    """Complex inputs: ``z / |z|``, 0 at 0."""
    if not self.is_complex():
        return sign(self)
    r = run("abs", [self])
    safe = _C.run("where", [run("eq", [r, 0.0], None, r.dtype), 1.0, r], None, r.dtype, 1)[0]
    return run("div", [self, safe], None, self.dtype)


@kernel("sign")
def sign(self):
    s = run("sign", [self])
    if not self.is_floating_point():
        return s
    # PyTorch's sign is (0 < x) - (x < 0): 0 for NaN, and +0 for -0.
    nonzero = run("logical_or", [run("lt", [self, 0], None, self.dtype), run("gt", [self, 0], None, self.dtype)])
    return _C.run("where", [nonzero, s, 0.0], None, self.dtype, 1)[0]


def _rounding(op):
    def k(self):
        # Integers are whole already: PyTorch returns them as they are.
        return self.clone() if not self.is_floating_point() else run(op, [self])

    return k


for _name in ("floor", "ceil", "round"):
    kernel(_name)(_rounding(_name))

# Unary ops with a float result (complex for complex inputs).
for _name in (
    "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "sigmoid",
    "reciprocal", "log1p", "expm1", "sinh", "cosh", "asin", "acos", "asinh",
    "acosh", "atanh", "atan",
):
    kernel(_name, complex=True)(lambda self, _op=_name: run(_op, [self], None, _float(self.dtype)))
for _name in ("silu", "erf", "erfc", "erfinv", "lgamma", "digamma"):
    kernel(_name)(lambda self, _op=_name: run(_op, [self], None, _float(self.dtype)))

# torch.special's Bessel and Gaussian tail functions: aten name -> device op.
for _name, _op in (
    ("i0", "i0"), ("special_i0e", "i0e"), ("special_i1", "i1"), ("special_i1e", "i1e"),
    ("special_modified_bessel_i0", "i0"), ("special_modified_bessel_i1", "i1"),
    ("special_modified_bessel_k0", "modified_bessel_k0"), ("special_modified_bessel_k1", "modified_bessel_k1"),
    ("special_scaled_modified_bessel_k0", "scaled_modified_bessel_k0"),
    ("special_scaled_modified_bessel_k1", "scaled_modified_bessel_k1"),
    ("special_spherical_bessel_j0", "spherical_bessel_j0"),
    ("special_bessel_j0", "bessel_j0"), ("special_bessel_j1", "bessel_j1"),
    ("special_bessel_y0", "bessel_y0"), ("special_bessel_y1", "bessel_y1"),
    ("special_erfcx", "erfcx"), ("special_log_ndtr", "log_ndtr"), ("special_ndtri", "ndtri"),
):
    kernel(_name)(lambda self, _op=_op: run(_op, [self], None, _float(self.dtype)))


@kernel("polygamma")
def polygamma(n, self):
    return run("polygamma", [self], {"n": n}, _float(self.dtype))


@kernel("signbit")
def signbit(self):
    if self.dtype == torch.bool:
        return run("full", [], {"shape": list(self.shape), "dtype": torch.bool, "value": 0.0})
    negative = run("lt", [self, 0], None, self.dtype)
    if not self.dtype.is_floating_point:
        return negative
    # -0.0 has its sign bit set too: 1 / -0.0 is -inf.
    zero = run("eq", [self, 0], None, self.dtype)
    negative_zero = run("logical_and", [zero, run("lt", [run("reciprocal", [self]), 0], None, self.dtype)])
    return run("logical_or", [negative, negative_zero])


@kernel("trunc")
def trunc(self):
    return self.clone() if not self.dtype.is_floating_point else _trunc(self)


@kernel("frac")
def frac(self):
    return run("sub", [self, _trunc(self)])


@kernel("log2", complex=True)
def log2(self):
    return run("mul", [run("log", [self], None, _float(self.dtype)), 1.4426950408889634])


@kernel("log10", complex=True)
def log10(self):
    return run("mul", [run("log", [self], None, _float(self.dtype)), 0.4342944819032518])


@kernel("exp2", complex=True)
def exp2(self):
    return run("exp", [run("mul", [self, 0.6931471805599453], None, _float(self.dtype))])


@kernel("bitwise_not")
def bitwise_not(self):
    if self.dtype == torch.bool:
        return run("logical_not", [self])
    # x ^ all-ones: -1 in every signed type, the maximum in unsigned ones.
    ones = torch.iinfo(self.dtype).max if not self.dtype.is_signed else -1
    return run("bitwise_xor", [self, ones], None, self.dtype)


@kernel("gelu")
def gelu(self, *, approximate="none"):
    return run("gelu", [self], {"approximate": approximate})


@kernel("clamp")
def clamp(self, min=None, max=None):
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    dtype = torch.result_type(self, min if max is None else max)
    if min is not None and max is not None:
        dtype = torch.promote_types(dtype, torch.result_type(self, min))
    if dtype != self.dtype:
        # An integer tensor clamped by a float bound is a float result.
        self = run("cast", [self], {"dtype": dtype})
    attrs = {}
    if min is not None:
        attrs["min"] = float(min)
    if max is not None:
        attrs["max"] = float(max)
    return run("clamp", [self], attrs)


@kernel("clamp.Tensor")
def clamp_tensor(self, min=None, max=None):
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    out = self
    if min is not None:
        out = run("maximum", [out, min], None, torch.result_type(out, min))
    if max is not None:
        out = run("minimum", [out, max], None, torch.result_type(out, max))
    return out


@kernel("clamp_min")
def clamp_min(self, min):
    return clamp(self, min=min)


@kernel("clamp_max")
def clamp_max(self, max):
    return clamp(self, max=max)


@kernel("clamp_min.Tensor")
def clamp_min_tensor(self, min):
    return clamp_tensor(self, min=min)


@kernel("clamp_max.Tensor")
def clamp_max_tensor(self, max):
    return clamp_tensor(self, max=max)


@kernel("where.self")
def where(condition, self, other):
    dtype = torch.result_type(self, other)
    return _C.run("where", [condition, self, other], None, dtype, 1)[0]


@kernel("where.ScalarOther", "where.ScalarSelf", "where.Scalar")
def where_scalar(condition, self, other):
    return where(condition, self, other)


@kernel("masked_fill.Scalar", "masked_fill.Tensor")
def masked_fill(self, mask, value):
    return _C.run("where", [mask, value, self], None, self.dtype, 1)[0]


@kernel("lerp.Scalar", "lerp.Tensor")
def lerp(self, end, weight):
    return run("add", [self, run("mul", [weight, run("sub", [end, self])], None, self.dtype)])


@kernel("addcmul")
def addcmul(self, tensor1, tensor2, *, value=1):
    prod = run("mul", [tensor1, tensor2], None, self.dtype)
    if value != 1:
        prod = run("mul", [prod, value], None, self.dtype)
    return run("add", [self, prod], None, self.dtype)


@kernel("addcdiv")
def addcdiv(self, tensor1, tensor2, *, value=1):
    quot = run("div", [tensor1, tensor2], None, self.dtype)
    if value != 1:
        quot = run("mul", [quot, value], None, self.dtype)
    return run("add", [self, quot], None, self.dtype)


@kernel("sigmoid_backward")
def sigmoid_backward(grad_output, output):
    # g * y * (1 - y)
    one_minus = run("sub", [1.0, output], None, output.dtype)
    return run("mul", [grad_output, run("mul", [output, one_minus])], None, output.dtype)


@kernel("tanh_backward")
def tanh_backward(grad_output, output):
    # g * (1 - y^2)
    one_minus = run("sub", [1.0, run("mul", [output, output])], None, output.dtype)
    return run("mul", [grad_output, one_minus], None, output.dtype)


@kernel("threshold_backward")
def threshold_backward(grad_output, self, threshold):
    keep = run("gt", [self, threshold], None, self.dtype)
    return _C.run("where", [keep, grad_output, 0], None, grad_output.dtype, 1)[0]


def _unary_vjp(op, attrs=None):
    def k(grad_output, self, **kwargs):
        merged = dict(attrs or {}, **kwargs)
        return _C.vjp(op, [self], [grad_output], merged)[0]

    return k


kernel("gelu_backward")(_unary_vjp("gelu"))
kernel("silu_backward")(_unary_vjp("silu"))


@kernel("hardshrink_backward", "softshrink_backward")
def shrink_backward(grad_out, self, lambd):
    """Both pass the gradient where ``|x| > λ`` and nothing inside."""
    return torch.where((self >= -lambd) & (self <= lambd), 0, grad_out).to(grad_out.dtype)


@kernel("logit_backward")
def logit_backward(grad_output, self, eps=None):
    """``g / (x (1 - x))``; outside ``[0, 1]`` NaN, or with ``eps`` 0 outside
    ``[eps, 1 - eps]`` (where the forward clamps), as on the CPU."""
    grad = grad_output / (self * (1 - self))
    if eps is None:
        return torch.where((self < 0) | (self > 1), float("nan"), grad)
    return torch.where((self < eps) | (self > 1 - eps), 0, grad)


def _integers(op, self, other):
    dtype = torch.result_type(self, other)
    if dtype.is_floating_point or dtype == torch.bool:
        raise NotImplementedError(f'"{op}" not implemented for {dtype} on the tpu device')
    return torch.broadcast_tensors(self.to(dtype), torch.as_tensor(other, device=self.device).to(dtype))


@kernel("gcd")
def gcd(self, other):
    """Euclid's algorithm on ``|a|, |b|``, all elements at once: a step
    ``(a, b) -> (b, a mod b)`` where ``b != 0``, until every ``b`` is 0 (a
    host read per few steps; at most about 1.44 * bits steps)."""
    a, b = (t.abs() for t in _integers("gcd", self, other))
    while True:
        for _ in range(4):
            nonzero = b != 0
            a, b = torch.where(nonzero, b, a), torch.where(nonzero, torch.remainder(a, torch.where(nonzero, b, 1)), 0)
        if not bool((b != 0).any()):
            return a


@kernel("lcm")
def lcm(self, other):
    """``|a / gcd(a, b) * b|``, 0 when either is 0; types narrower than
    int32 multiply in int32 and wrap after the ``abs``, as C++ does on the
    CPU."""
    a, b = _integers("lcm", self, other)
    dtype = a.dtype
    if dtype in (torch.int8, torch.int16, torch.uint8):
        a, b = a.to(torch.int32), b.to(torch.int32)
    g = gcd(a, b)
    out = (torch.div(a, torch.where(g == 0, 1, g), rounding_mode="trunc") * b).abs()
    return torch.where(g == 0, 0, out).to(dtype)
