"""The aten ops that are exact by construction, so carbon.enable lets them
run as torch's own (docs/enable.md, "Allowed as they are").

An op is exact by construction when every output element is either a copy of
an input element, a value that does not depend on floating-point rounding
(comparisons, indices, integer arithmetic), or ONE correctly rounded IEEE
operation (x*y, x/y of two tensors, sqrt, a format conversion) — which IEEE
754 fixes bit for bit, on any CPU or GPU. Everything else must be routed
(carbon._enable_routes) or is refused in strict mode.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

__all__ = ["ALLOWED", "COMPLEX_EXACT", "PASSING_NAMESPACES", "PER_TENSOR", "has_complex", "why_not_complex", "why_not_exact", "why_not_foreign"]

# Ops with one correctly rounded IEEE operation per element, or none. A
# Python/CPU scalar in mul is rounded to the tensor's compute type first, the
# same on every device.
PER_TENSOR = frozenset({
    "neg", "abs", "mul", "maximum", "minimum", "fmax", "fmin", "clamp", "clamp_min", "clamp_max",
    "relu", "threshold", "threshold_backward", "hardtanh", "hardtanh_backward", "leaky_relu",
    "_prelu_kernel", "_prelu_kernel_backward",
    "leaky_relu_backward", "sign", "sgn", "signbit", "floor", "ceil", "trunc", "round", "fmod", "copysign",
    "nan_to_num", "zero", "fill", "copy", "clone", "where", "masked_fill",
    # x − trunc(x) is exact (its bits are a subset of x's)
    "frac",
})

ALLOWED = PER_TENSOR | frozenset({
    # copies, conversions (one correctly rounded conversion per element), factories
    "_to_copy", "to", "contiguous", "_unsafe_view", "view", "reshape", "lift_fresh", "lift_fresh_copy",
    "_local_scalar_dense", "_copy_from", "_copy_from_and_resize", "resize", "resize_as", "set",
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "ones",
    "ones_like", "full", "full_like", "new_zeros", "new_ones", "new_full", "scalar_tensor", "eye", "tril", "triu",
    "_efficientzerotensor", "_pin_memory", "is_pinned", "complex", "view_as_complex", "view_as_real",
    # data movement and indexing
    "cat", "stack", "index", "_unsafe_index", "index_select", "gather", "scatter", "select_scatter",
    "slice_scatter", "diagonal_scatter", "as_strided_scatter", "masked_scatter", "masked_select", "embedding",
    "flip", "roll", "repeat", "repeat_interleave", "constant_pad_nd", "index_fill", "take", "nonzero",
    "unique", "_unique2", "unique_consecutive", "tile", "split_with_sizes_copy",
    "unbind_copy", "narrow_copy", "tril_indices", "triu_indices", "select_backward", "slice_backward",
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "unsafe_split", "unsafe_split_with_sizes",
    "unsafe_chunk", "pixel_shuffle", "pixel_unshuffle", "channel_shuffle", "native_channel_shuffle", "diagonal_copy",
    "reflection_pad1d", "reflection_pad2d", "reflection_pad3d", "replication_pad1d", "replication_pad2d",
    "replication_pad3d",
    "diagonal_backward", "expand_copy", "permute_copy", "t_copy", "transpose_copy", "view_copy",
    "rot90", "block_diag", "diag_embed", "alias_copy", "as_strided_copy", "squeeze_copy", "unsqueeze_copy",
    "unfold_copy", "_chunk_cat", "_unsafe_masked_index", "_upsample_nearest_exact1d", "_upsample_nearest_exact2d",
    "_upsample_nearest_exact3d",
    # an LU factorization's triangles and its permutation matrix (copies; the factorization itself is routed)
    "lu_unpack",
    # packing and padding variable-length sequences (copies; each position moves to at most one place) and
    # cuDNN's flat RNN weight buffer (a copy made when an RNN moves to a GPU)
    "_pack_padded_sequence", "_pack_padded_sequence_backward", "_pad_packed_sequence", "_cudnn_rnn_flatten_weight",
    # exact by construction: a selection or a bit-level operation per element (nextafter a neighbour); the
    # shrinks' gradients select g or +0 (softshrink itself is routed:
    # torch's CPU kernel gives −0 or +0 in the band depending on where an element sits)
    "heaviside", "nextafter", "hardshrink", "hardshrink_backward", "softshrink_backward",
    # an xor of every element's (exactly widened) bits: order-free
    "hash_tensor",
    # a transform's sample frequencies: integers (exact) times the scalar 1/(n·d), one rounding each
    "fft_fftfreq", "fft_rfftfreq",
    # comparisons and logic
    "isin",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not", "logical_xor", "isnan",
    "isinf", "isfinite", "isneginf", "isposinf", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not",
    "any", "all", "equal", "is_nonzero", "is_same_size", "_is_all_true", "_is_any_true",
    # reductions without rounding (max pooling: the window's maximum and its index; the backward is routed)
    "amax", "amin", "max", "min", "argmax", "argmin", "aminmax", "count_nonzero", "max_pool2d_with_indices",
    "max_pool3d_with_indices", "max_pool2d", "max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d",
    # selections: every value is one of the input's (indices among equal values: see docs/enable.md)
    "searchsorted", "bucketize", "im2col",
    # bookkeeping
    "_assert_async", "_functional_assert_async", "_assert_scalar", "sym_size", "sym_stride", "sym_numel",
    "sym_storage_offset", "record_stream", "_foreach_zero", "_foreach_copy", "_foreach_neg", "_foreach_abs",
    "_foreach_maximum", "_foreach_minimum", "_foreach_clamp_min", "_foreach_clamp_max", "_foreach_sign",
    "_has_compatible_shallow_copy_type", "as_strided",
    # in-place metadata changes (their out-of-place forms are views)
    "transpose", "t", "squeeze", "unsqueeze", "swapaxes", "swapdims",
    # mixed precision: g * inv_scale (one rounding) and a non-finite check; scale * factor
    "_amp_foreach_non_finite_check_and_unscale", "_amp_update_scale", "_nested_tensor_from_mask_left_aligned", "detach", "alias",
})


# Op namespaces other than aten that pass unchanged: carbon's own ops, profiler markers and collectives
# (a floating-point all-reduce adds in the backend's order: DDP under carbon.enable should use
# carbon.allreduce_hook, docs/distributed.md). Ops of any other library are refused unless routed.
PASSING_NAMESPACES = frozenset({"carbon", "profiler", "c10d", "_c10d_functional", "_c10d_functional_autograd",
                                "_dtensor"})

# Complex tensors: the ops above are exact for real tensors, but a complex product, quotient or modulus is
# several rounded operations, which torch fuses differently on each device. With a complex argument only
# these run as torch's own: copies, views and data movement, and the componentwise operations whose every
# component is one correctly rounded operation (add / sub with a real alpha, neg, conj). carbon.enable
# routes complex `mul`, `sum`, products, modulus, phase, transforms and draws itself
# (_enable_routes.COMPLEX_ROUTES); everything else is refused.
COMPLEX_EXACT = frozenset({
    "_to_copy", "to", "clone", "copy", "contiguous", "_unsafe_view", "view", "reshape", "lift_fresh",
    "lift_fresh_copy", "detach", "alias", "_local_scalar_dense", "_copy_from", "_copy_from_and_resize", "resize",
    "resize_as", "set", "as_strided", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
    "zeros", "zeros_like", "new_zeros", "ones_like", "full_like", "fill", "zero", "_efficientzerotensor",
    "cat", "stack", "index", "_unsafe_index", "index_select", "gather", "scatter", "select_scatter",
    "slice_scatter", "masked_fill", "where", "flip", "roll", "repeat", "tile", "constant_pad_nd", "expand_copy",
    "permute_copy", "t_copy", "transpose_copy", "view_copy", "unbind_copy", "split_with_sizes_copy", "narrow_copy",
    "select_backward", "slice_backward", "transpose", "t", "squeeze", "unsqueeze", "swapaxes", "swapdims",
    "view_as_real", "view_as_complex", "real", "imag", "complex", "conj", "_conj", "conj_physical",
    "resolve_conj", "resolve_neg", "_neg_view", "neg", "add", "sub", "rsub", "eq", "ne", "isnan", "isinf",
    "isfinite", "_has_compatible_shallow_copy_type", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
})


def has_complex(args: tuple, kwargs: dict) -> bool:
    """Whether an argument is a complex tensor, or the op is asked for a complex result. (Runs for every aten op
    while enabled: plain loops, no generators.)"""
    if _any_complex(args) or (kwargs and _any_complex(kwargs.values())):
        return True
    dtype = kwargs.get("dtype")
    return isinstance(dtype, torch.dtype) and dtype.is_complex


def _any_complex(values: Any) -> bool:
    for v in values:
        if isinstance(v, torch.Tensor):
            if v.is_complex():
                return True
        elif isinstance(v, (list, tuple)) and _any_complex(v):
            return True
    return False


def why_not_foreign(func: Any, base: str, args: tuple, kwargs: dict) -> Optional[str]:
    """None for an op of another namespace that is exact by construction: carbon's own, profiler markers,
    collectives, and any op without a floating-point or complex tensor argument (a library's version query,
    an integer kernel computes nothing that rounds)."""
    if func.namespace in PASSING_NAMESPACES:
        return None
    if not any(t.is_floating_point() or t.is_complex() for t in _tensors(list(args) + list(kwargs.values()))):
        return None
    return f"an op of the {func.namespace!r} library, which carbon does not cover"


SCATTER_REDUCE = ("scatter with reduce= (its additions or products are done one by one in the order of the "
                   "indices on the CPU and of atomics on CUDA); use scatter_reduce / scatter_add (routed: exact sums)")


def why_not_complex(func: Any, base: str, args: tuple, kwargs: dict) -> Optional[str]:
    """None when an op with complex arguments is exact by construction (see COMPLEX_EXACT), else why not."""
    if base == "scatter" and "reduce" in func._overloadname:
        return SCATTER_REDUCE
    if base in COMPLEX_EXACT or _is_view(func):
        alpha = kwargs.get("alpha", args[2] if base in ("add", "sub", "rsub") and len(args) > 2 else 1)
        if isinstance(alpha, complex) or (isinstance(alpha, torch.Tensor) and alpha.is_complex()):
            return "a complex alpha (a complex product)"
        return None
    return ("complex arithmetic: carbon covers complex copies, views, add, sub, neg, conj, mul, sum, mm, bmm, abs, "
            "angle, sgn, Fourier transforms and random draws")


def _is_view(func: Any) -> bool:
    """A pure view (its outputs alias its input, nothing written): computes nothing."""
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def _tensors(values: Any):
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from _tensors(v)


def _integral(v: Any) -> bool:
    return isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) <= 2 ** 24)


def why_not_exact(func: Any, base: str, args: tuple, kwargs: dict) -> Optional[str]:
    """None when the op is exact by construction for these arguments, else why not."""
    if base == "scatter" and "reduce" in func._overloadname:
        return SCATTER_REDUCE
    if base in ALLOWED or _is_view(func):
        return None
    if base == "arange":
        # start + i * step: exact when every value is an integer below 2^24
        values = [v for v in list(args) + list(kwargs.values()) if isinstance(v, (int, float)) and not isinstance(v, bool)]
        return None if all(_integral(v) for v in values) else "arange with a non-integer start or step"
    tensors = list(_tensors(list(args) + list(kwargs.values())))
    if tensors and not any(t.is_floating_point() or t.is_complex() for t in tensors):
        floats_out = isinstance(kwargs.get("dtype"), torch.dtype) and kwargs["dtype"].is_floating_point
        if not floats_out:
            return INTEGER_INPUTS  # integer and boolean arithmetic is exact: allowed if the result is too
    return "not on carbon's list of routed or exact ops"


# why_not_exact's answer for an op whose tensor arguments are all integer or boolean: exact when its result is
# integer or boolean too; a floating-point result (special_ndtri of an integer tensor, say) comes from torch's own
# per-device kernel, so the caller runs the op and then asks floating_result_of_integers.
INTEGER_INPUTS = "integer inputs"


def floating_result_of_integers(result: Any) -> Optional[str]:
    """Why an op allowed for its integer inputs is not exact after all (its
    result is floating point or complex), or None."""
    if any(t.is_floating_point() or t.is_complex() for t in _tensors([result])):
        return "a floating-point result of integer inputs, computed by torch's own kernel, which may differ by device"
    return None
