"""CaseSpace: the case distribution a kernel states once (fuzz::CaseSpace, fuzz/generators.hpp).

A CaseSpace is the C++ space and nothing else: its fields are fuzz::CaseSpace's, checked by the
C++ code (fuzz::case_space_from_json, fuzz::check_space), and its JSON (format
gdn-case-space/1) is what ``gdn-testbed fuzz --space FILE`` and ``generate --space FILE`` read.

    CaseSpace()                                   # preset "chunked" (C = 64)
    CaseSpace("everything")                       # every axis the references support
    CaseSpace(dtypes="bf16", K=128, V=128, H=[1, 2, 4], group=[1, 2], lengths=[0, 1, 63, 64, 65],
              sequences=(1, 4), regimes=["mild", "underflow"], fused_gates="off",
              v_major="always", state_cache="off", l2norm="always")

Every field of the C++ struct can be given by its name (max_K, K_values, input_dtypes, ...);
the short forms map onto them: dtypes -> input_dtypes, K -> K_values, V -> V_values,
H -> H_values, group -> group_values, lengths -> length_values, scale -> scale_values,
sequences=(lo, hi) -> min_sequences, max_sequences. A scalar pins (K=128), a list or range
draws from the set. Storage conventions: state_dtypes (["f32"] by default; ["f32", "bf16"] for a
kernel with fp32 or bf16 state pools) and gate_spaces (["log"] by default; ["linear"] for a
kernel that takes alpha = exp(g)). Features take "off", "sometimes", "always" (or False / True =
off / sometimes).
"""
from __future__ import annotations

import json
import os
from collections import namedtuple
from typing import Iterator

from . import _core

FORMAT = "gdn-case-space/1"
PRESETS = ("everything", "chunked", "recurrent_prefill", "decode", "chunked_prefill")

_ALIASES = {"dtypes": "input_dtypes", "K": "K_values", "V": "V_values", "H": "H_values", "group": "group_values",
            "lengths": "length_values", "scale": "scale_values"}
_LIST_FIELDS = {"input_dtypes", "regimes", "K_values", "V_values", "H_values", "group_values", "length_values",
                "scale_values", "state_dtypes", "gate_spaces"}

GeneratedCase = namedtuple("GeneratedCase", "problem inputs generator")


def _as_list(value):
    if isinstance(value, (str, bytes, int, float)):
        return [value]
    return list(value)


class CaseSpace:
    """An immutable case space; see the module docstring."""

    def __init__(self, preset: str = "chunked", *, chunk_size: int | None = None, **fields):
        if preset not in PRESETS:
            raise ValueError(f"CaseSpace: preset must be one of {', '.join(PRESETS)}, got {preset!r}")
        data = {"format": FORMAT, "preset": preset}
        if chunk_size is not None:
            data["chunk_size"] = chunk_size
        data.update(self._expand(fields))
        self._data = self._normalize(data)

    # ---- construction ----

    @staticmethod
    def _expand(fields: dict) -> dict:
        out = {}
        for key, value in fields.items():
            if key == "sequences":
                low, high = (value, value) if isinstance(value, int) else tuple(value)
                out["min_sequences"], out["max_sequences"] = int(low), int(high)
                continue
            name = _ALIASES.get(key, key)
            if name in out:
                raise TypeError(f"CaseSpace: '{key}' and '{name}' name the same field")
            if name in _LIST_FIELDS:
                value = _as_list(value)
            if isinstance(value, range):
                value = list(value)
            out[name] = value
        return out

    @staticmethod
    def _normalize(data: dict) -> dict:
        try:
            text = json.dumps(data, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise ValueError(f"CaseSpace: not expressible as JSON: {error}") from None
        return json.loads(_core.space_normalize(text))

    @classmethod
    def from_json(cls, data) -> "CaseSpace":
        """From the JSON object (a dict, or its text); strict: unknown keys raise ValueError."""
        if isinstance(data, (str, bytes)):
            data = json.loads(data)
        space = cls.__new__(cls)
        space._data = cls._normalize(dict(data))
        return space

    @classmethod
    def load(cls, path) -> "CaseSpace":
        with open(path, encoding="utf-8") as f:
            return cls.from_json(json.load(f))

    def replace(self, **fields) -> "CaseSpace":
        """A copy with some fields changed (the same names and short forms as the constructor)."""
        data = dict(self._data)
        data.update(self._expand(fields))
        return CaseSpace.from_json(data)

    # ---- reading ----

    def to_json(self) -> dict:
        """Every field (format gdn-case-space/1), as `gdn-testbed --space FILE` reads it."""
        return dict(self._data)

    def save(self, path) -> None:
        """Writes the JSON atomically (temporary file and rename)."""
        _core.write_text_file(os.fspath(path), json.dumps(self._data, indent=2) + "\n")

    def __getattr__(self, name):
        data = self.__dict__.get("_data")
        if data is not None:
            key = _ALIASES.get(name, name)
            if key in data:
                return data[key]
        raise AttributeError(f"CaseSpace has no field '{name}'")

    def __eq__(self, other) -> bool:
        return isinstance(other, CaseSpace) and self._data == other._data

    def __repr__(self) -> str:
        default = CaseSpace.from_json({"format": FORMAT})._data
        changed = {k: v for k, v in self._data.items() if default.get(k) != v}
        return "CaseSpace(" + ", ".join(f"{k}={v!r}" for k, v in changed.items() if k != "format") + ")"

    def text(self) -> str:
        return json.dumps(self._data, sort_keys=True)

    # ---- drawing ----

    def cases(self, count: int, seed: int = 1) -> Iterator[GeneratedCase]:
        """The first `count` cases of a campaign with this seed (the cases `gdn-testbed fuzz --seed`
        and `generate --seed` make from the same space)."""
        for index in range(count):
            yield self.case(index, seed=seed)

    def case(self, index: int, seed: int = 1) -> GeneratedCase:
        """Case `index` of a campaign with this seed: what `gdn-testbed fuzz --seed` names
        fuzz/INDEX, without drawing the cases before it."""
        if index < 0:
            raise ValueError(f"CaseSpace.case: index must be >= 0, got {index}")
        return sample_case(_core.case_seed(seed, index), self)


def _space_text(space) -> str:
    if space is None:
        space = CaseSpace()
    if isinstance(space, dict):
        space = CaseSpace.from_json(space)
    if not isinstance(space, CaseSpace):
        raise TypeError(f"space: expected a gdn_testbed.CaseSpace, got {type(space).__name__}")
    return space.text()


def draw_case(seed: int, space: CaseSpace | None = None):
    """fuzz::draw_case: (problem, input options dict, data seed) of this case seed."""
    problem, options, data_seed = _core.draw_case(int(seed), _space_text(space))
    return problem, json.loads(options), data_seed


def sample_case(seed: int, space: CaseSpace | None = None) -> GeneratedCase:
    """fuzz::sample_case: the case of this seed with its inputs made and how it was drawn."""
    problem, inputs, generator = _core.sample_case(int(seed), _space_text(space))
    return GeneratedCase(problem, inputs, json.loads(generator))
