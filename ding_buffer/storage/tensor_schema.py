"""The schema of a ``TensorStorage``: field paths with their per-item shape and dtype.

Inferred from the first item written (``infer_schema``); every later item is checked against it
(``check_leaves``: exact shapes and dtypes, except that Python ``int`` is accepted into a float field), and a
mismatch is a ``ValueError`` naming the field. For persistence the schema is exported as plain lists
(``export_schema``) and imported again together with the saved field tensors (``import_fields``), both
loadable with ``weights_only=True``.
"""

from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch

from .tree import Path, flatten, path_name, to_tensor

Schema = Dict[Path, Tuple[Tuple[int, ...], torch.dtype]]


def dtype_name(dtype: Any) -> str:
    """``dtype`` as a saved schema names it (``torch.float32`` -> ``'float32'``; a numpy dtype by its name)."""
    return str(dtype).replace('torch.', '')


def dtype_from_str(name: str) -> torch.dtype:
    dtype = getattr(torch, name.replace('torch.', ''), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in saved schema")
    return dtype


def batched_tensor(leaf: Any, path: Path, into: Optional[torch.dtype] = None) -> torch.Tensor:
    """A batched leaf as a tensor: Python lists/tuples of rows are accepted besides tensors and arrays (numbers of
    one shape; anything else is a ``TypeError`` / ``ValueError`` naming the field). ``into``: the float dtype of the
    field, which takes ints beyond int64 too."""
    if not isinstance(leaf, (list, tuple)):
        return to_tensor(leaf, path)
    try:
        try:
            out = torch.as_tensor(leaf)
        except (RuntimeError, ValueError, OverflowError):  # (ints beyond int64: as floats where the field is one)
            if into is None or not into.is_floating_point:
                raise
            out = torch.as_tensor(leaf, dtype=torch.float64).to(into)
    except (TypeError, ValueError, RuntimeError, OverflowError) as e:
        raise ValueError(
            f"batched field '{path_name(path)}' is a list that is not a numeric array of one shape "
            f"(ragged, None, strings, tensors or ints beyond int64?): {e}"
        ) from None
    if out.dtype not in (torch.bool, torch.int64, torch.float32, torch.float64, into) or out.dim() == 0:
        raise TypeError(
            f"batched field '{path_name(path)}' must be a list of numbers with a leading batch "
            f"dimension, got dtype {out.dtype} shape {tuple(out.shape)}"
        )
    return out


def infer_schema(flat: Dict[Path, torch.Tensor]) -> Schema:
    return {p: (tuple(t.shape), t.dtype) for p, t in flat.items()}


def field_names(schema: Schema) -> List[str]:
    return [path_name(p) for p in schema]


def item_flat(item: Any, i: int, skip_keys: Tuple[str, ...]) -> Dict[Path, Any]:
    """Item ``i`` flattened to ``{path: leaf}`` without the top-level ``skip_keys``; it must be a non-empty dict."""
    if type(item) is not dict and not isinstance(item, Mapping):
        raise TypeError(f"tensor storage stores dicts of tensors/arrays/scalars; item {i} is {type(item).__name__}")
    flat = flatten(item, skip_top=skip_keys)
    if not flat:
        raise ValueError(f"item {i} has no fields")
    return flat


def _twins(path: Path, others: Any, of: str, other: str) -> str:
    """A note when ``path`` prints as one of ``others`` (``{'a': {'b': x}}`` and ``{'a.b': x}`` are both 'a.b')."""
    twin = next((p for p in others if p != path and path_name(p) == path_name(path)), None)
    return '' if twin is None else f"; the {of}'s '{path_name(path)}' is the key path {path}, the {other}'s {twin}"


def check_leaves(flat: Dict[Path, Any], schema: Schema, where: str, batched: bool) -> Dict[Path, torch.Tensor]:
    """Convert leaves and check them against ``schema``; ``where`` says which item for the message."""
    missing = [p for p in schema if p not in flat]
    if missing:
        names = [path_name(p) for p in missing]
        raise ValueError(
            f"{where} is missing field(s) {names}; schema fields: {field_names(schema)}"
            f"{next(filter(None, (_twins(p, flat, 'schema', 'item') for p in missing)), '')}"
        )
    out = {}
    for path, leaf in flat.items():
        if path not in schema:
            raise ValueError(
                f"{where} has unexpected field '{path_name(path)}'; schema fields: {field_names(schema)}"
                f"{_twins(path, schema, 'item', 'schema')}"
            )
        shape, dtype = schema[path]
        py_number = type(leaf) in (int, float) or (batched and isinstance(leaf, (list, tuple)))
        if type(leaf) is int and dtype.is_floating_point and not -(2**63) <= leaf < 2**63:  # beyond int64: as a float
            try:
                tensor = torch.tensor(float(leaf), dtype=torch.float64).to(dtype)
            except OverflowError:
                raise ValueError(
                    f"{where}: field '{path_name(path)}' int of {len(str(abs(leaf)))} digits is beyond every float"
                ) from None
        else:
            tensor = batched_tensor(leaf, path, dtype) if batched else to_tensor(leaf, path)
        got_shape = tuple(tensor.shape[1:]) if batched else tuple(tensor.shape)
        if got_shape != shape:
            raise ValueError(f"{where}: field '{path_name(path)}' has shape {got_shape}, expected {shape}")
        if tensor.dtype != dtype:
            # Python numbers: ints go into any float field, floats (doubles, read as float32 above) into float64
            if not (py_number and dtype.is_floating_point and tensor.dtype != torch.bool):
                raise ValueError(f"{where}: field '{path_name(path)}' has dtype {tensor.dtype}, expected {dtype}")
            if not tensor.dtype.is_floating_point:
                tensor = tensor.to(dtype)
            elif dtype == torch.float64:
                tensor = torch.as_tensor(leaf, dtype=dtype)  # exactly (not via the float32 read)
            else:
                raise ValueError(f"{where}: field '{path_name(path)}' has dtype {tensor.dtype}, expected {dtype}")
        out[path] = tensor
    return out


def export_schema(schema: Optional[Schema]) -> List[list]:
    """``[[path, shape, dtype name], ...]``: plain lists, loadable with ``weights_only=True``."""
    if schema is None:
        return []
    return [[list(p), list(shape), dtype_name(dtype)] for p, (shape, dtype) in schema.items()]


def import_fields(schema_list: Any, fields: Any, n: int) -> Tuple[Schema, List[torch.Tensor]]:
    """Validate a saved schema and its ``n``-row field tensors; ``ValueError`` on any mismatch."""
    schema: Schema = {}
    for entry in schema_list:
        path, shape, dtype = entry
        if not isinstance(path, (list, tuple)) or not path or not all(isinstance(k, str) and k for k in path):
            raise ValueError(f"saved field path {path!r:.60} must be a non-empty list of non-empty names")
        shape = tuple(int(s) for s in shape)
        if any(s < 0 or s > 2**40 for s in shape):
            raise ValueError(f"saved field '{path_name(tuple(path))}' has an impossible shape {shape}")
        key = tuple(path)
        if key in schema:
            raise ValueError(f"saved schema names field '{path_name(key)}' twice")
        schema[key] = (shape, dtype_from_str(dtype))
    if len(fields) != len(schema):
        raise ValueError(f"saved storage has {len(schema)} schema fields but {len(fields)} field tensors")
    for (path, (shape, dtype)), tensor in zip(schema.items(), fields):
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != (n, *shape) or tensor.dtype != dtype:
            raise ValueError(f"saved field '{path_name(path)}' does not match its schema {(n, *shape)} {dtype}")
    return schema, list(fields)
