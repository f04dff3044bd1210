"""The exported row: ids, mask and every Record field as a flat column of one type.

JSONL, Parquet and `--format hf` write this same row (so `load_dataset("parquet")` and
`load_from_disk` give the same rows). A field added to Record appears in every export with no
change here, typed from its annotation (str, int, float, bool; anything else, such as the
`sampling` map, as JSON text so every row keeps one type). Docs: docs/records.md.
"""

from __future__ import annotations

import itertools
import json
from array import array
from collections.abc import Sequence
from dataclasses import MISSING, dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from eagle_synth.ids import unpack_ids
from eagle_synth.records import RawRecord, Record

# Leading columns, in order (the export's columns before every Record field was added) and
# their kinds; prompt_tokens/completion_tokens count the row's own ids, after clipping.
LEAD_COLUMNS = (
    ("key", "string"),
    ("id", "string"),
    ("sample", "int32"),
    ("turn", "int32"),
    ("input_ids", "ids"),
    ("loss_mask", "mask"),
    ("prompt_tokens", "int32"),
    ("completion_tokens", "int32"),
    ("finish_reason", "string"),
)
# Record fields that are not columns of their own: the ids become input_ids/loss_mask, and the
# server's counts are replaced by the row's own (a clipped row has fewer ids than the server made).
_NOT_COLUMNS = frozenset({"prompt_ids", "output_ids"})
# Column kind of each scalar Record annotation (optional or not); any other is stored as JSON text.
ANNOTATION_KINDS = {"str": "string", "int": "int64", "float": "float64", "bool": "bool"}
JSON_KIND = "json"
_CONVERT: dict[str, Any] = {"string": str, "int32": int, "int64": int, "float64": float, "bool": bool}


@dataclass(frozen=True, slots=True)
class Column:
    """One exported column (a Record field, or input_ids / loss_mask) of one `kind`: string,
    int32, int64, float64, bool, json (JSON text), ids (list of int32) or mask (list of int8);
    `default` is the value for a record stored without the field (an older file)."""

    name: str
    kind: str
    default: Any = None

    def value(self, meta: dict) -> Any:
        """This column's value for one record's metadata, in its single type (None for null)."""
        value = meta.get(self.name, self.default)
        if value is None:
            return None
        if convert := _CONVERT.get(self.kind):
            return convert(value)
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _field_default(name: str) -> Any:
    spec = Record.__dataclass_fields__.get(name)
    if spec is not None and spec.default is not MISSING:
        return spec.default
    if spec is not None and spec.default_factory is not MISSING:
        return spec.default_factory()
    return None


@lru_cache(maxsize=1)
def columns() -> tuple[Column, ...]:
    """Every exported column, in order: LEAD_COLUMNS, then the other Record fields in their order."""
    kinds = dict(LEAD_COLUMNS)
    for name, spec in Record.__dataclass_fields__.items():
        if name not in kinds and name not in _NOT_COLUMNS:
            kinds[name] = ANNOTATION_KINDS.get(str(spec.type).removesuffix(" | None"), JSON_KIND)
    return tuple(Column(name, kind, _field_default(name)) for name, kind in kinds.items())


def _meta_with_lengths(raw: RawRecord) -> dict:
    # seq_len is speculators' name for the total.
    return {
        **raw.meta,
        "prompt_tokens": raw.prompt_len,
        "completion_tokens": raw.output_len,
        "seq_len": raw.prompt_len + raw.output_len,
    }


def json_row(raw: RawRecord) -> dict:
    """One record's row with Python values (lists of ints for the ids and mask)."""
    meta = _meta_with_lengths(raw)
    special = {
        "ids": lambda: unpack_ids(raw.prompt_u32 + raw.output_u32),
        "mask": lambda: [0] * raw.prompt_len + [1] * raw.output_len,
    }
    return {c.name: special[c.kind]() if c.kind in special else c.value(meta) for c in columns()}


def _arrow_type(kind: str):
    import pyarrow as pa

    return {
        "string": pa.string(),
        "json": pa.string(),
        "int32": pa.int32(),
        "int64": pa.int64(),
        "float64": pa.float64(),
        "bool": pa.bool_(),
        "ids": pa.list_(pa.int32()),
        "mask": pa.list_(pa.int8()),
    }[kind]


def arrow_schema(selected: Sequence[Column] | None = None):
    """The Arrow schema of `selected` columns (default: every column)."""
    import pyarrow as pa

    return pa.schema([(column.name, _arrow_type(column.kind)) for column in (selected or columns())])


def arrow_batch(group: Sequence[RawRecord], schema, selected: Sequence[Column] | None = None):
    """One record batch of `selected` columns; the ids' bytes become the list values buffer as they are."""
    import pyarrow as pa

    offsets = array("i", itertools.accumulate((raw.prompt_len + raw.output_len for raw in group), initial=0))
    total = offsets[-1]
    offsets_array = pa.array(offsets, type=pa.int32())
    metas = [_meta_with_lengths(raw) for raw in group]
    arrays = []
    for column in selected or columns():
        if column.kind == "ids":
            ids = np.frombuffer(b"".join(raw.prompt_u32 + raw.output_u32 for raw in group), dtype="<i4")
            # Native byte order for Arrow: no copy on a little-endian machine.
            values = pa.Array.from_buffers(pa.int32(), total, [None, pa.py_buffer(ids.astype(np.int32, copy=False))])
            arrays.append(pa.ListArray.from_arrays(offsets_array, values))
        elif column.kind == "mask":
            mask = b"".join(b"\x00" * raw.prompt_len + b"\x01" * raw.output_len for raw in group)
            values = pa.Array.from_buffers(pa.int8(), total, [None, pa.py_buffer(mask)])
            arrays.append(pa.ListArray.from_arrays(offsets_array, values))
        else:
            arrays.append(pa.array([column.value(meta) for meta in metas], _arrow_type(column.kind)))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
