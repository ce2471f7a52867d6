"""Reading committed results: verdict JSON, adapter logs, campaign summaries, GPU suite tallies,
sanitizer summaries, run manifests, chunked accuracy judges, Google Benchmark JSON, peer JSON.

Every file under the results folder is classified by its content (schemas: reports/README.md);
files of no known kind are listed as ignored, never silently dropped. The first folder of a
file's path under the results folder is its device kind (results/<kind>/...).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

SHAPE_KEYS = ("N", "T", "H", "HV", "K", "V")
STATUSES = ("PASS", "FAIL", "ERROR", "SKIPPED")


class InputError(ValueError):
    """A results file that claims a known kind but breaks its schema (names file and rule)."""


def number(value):
    """JSON numbers, and the strings "inf"/"-inf"/"nan" the oracle writes for non-finite ones."""
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("inf", "+inf", "infinity"):
            return math.inf
        if text in ("-inf", "-infinity"):
            return -math.inf
        if text == "nan":
            return math.nan
        try:
            return float(text)
        except ValueError:
            return None
    return None


@dataclass
class Provenance:
    """Where a results file came from: what the reports state for every input."""
    path: str
    kind: str
    device: str | None = None
    date: str | None = None
    commit: str | None = None
    command: str | None = None
    records: int = 0


@dataclass
class Verdict:
    case: str
    implementation: str
    status: str
    problem_text: str = ""
    problem: dict = field(default_factory=dict)  # the gdn.problem object, when known
    generator: dict | None = None
    worst_margin: float | None = None
    rel_rms: dict = field(default_factory=dict)        # tensor -> relative RMS error
    max_abs_error: dict = field(default_factory=dict)  # tensor -> max |ref - x|
    baseline_rel_rms: dict = field(default_factory=dict)
    checks: list = field(default_factory=list)        # dicts: tensor, metric, error, budget, margin, pass
    budget: str = ""
    message: str = ""
    source: str = ""
    file: str = ""
    output: str = ""
    device: str = ""
    regime: str = ""       # the gate regime, when a campaign summary already resolved it
    worst_check: str = ""  # "tensor metric: error > budget", when the checks themselves are not kept
    judge: str = ""        # the file of verdicts it came from (a campaign summary keeps the raw file's name)


@dataclass
class Benchmark:
    name: str
    source: str
    time_ms: float
    shape: dict
    counters: dict
    aggregate: str  # "median", "mean", "" (single run)
    label: str = ""  # Google Benchmark's label (SetLabel): a named shape a peer result may name too


@dataclass
class PeerResult:
    peer: str
    version: str
    name: str
    source: str
    time_ms: float
    shape: dict
    counters: dict


@dataclass
class Results:
    provenance: list = field(default_factory=list)
    verdicts: list = field(default_factory=list)
    benchmarks: list = field(default_factory=list)
    context: dict = field(default_factory=dict)  # source -> Google Benchmark context
    peers: list = field(default_factory=list)
    tallies: list = field(default_factory=list)  # conformance tallies: dicts, one per kernel and property
    fuzz: list = field(default_factory=list)     # fuzz tallies: dicts, one per file and implementation
    fuzz_failures: list = field(default_factory=list)
    sanitize: list = field(default_factory=list)   # dicts: source, tool, and the tool's entry
    faults: list = field(default_factory=list)     # fault-campaign results (gdn-faults/1), with "source"
    conformance_runs: list = field(default_factory=list)  # gdn-conformance-summary/1: a CLI conformance run's tally
    adapter_runs: list = field(default_factory=list)   # gdn-adapter-verdicts/1 (python/gpu/run_adapters.py)
    backward_runs: list = field(default_factory=list)  # gdn-backward-verdicts/1 (python/gpu/run_backward.py)
    manifests: dict = field(default_factory=dict)  # device kind -> manifest object
    errors: list = field(default_factory=list)     # dicts: source, case, problem, implementation, rel_rms_o, rel_rms_hT
    ignored: list = field(default_factory=list)  # (path, why)


def device_kind(source: str) -> str:
    """The device kind of a results file: the first folder of its path under the results folder
    (results/h200/bench_decode.json -> "h200"); files at the top level have none."""
    parts = Path(source).parts
    return parts[0] if len(parts) > 1 else "(top level)"


# --- problem text (gdn::Problem::describe) -----------------------------------------------------

_DESCRIBE = re.compile(r"(\w+)=([^\s]+)")


def parse_problem_text(text: str) -> dict:
    """The fields of gdn::Problem::describe() ("N=2 T=12 H=2 HV=4 K=16 V=8 dtype=bf16 gate=f32
    l2norm h0 hT"), as a partial gdn.problem object: what a verdict without problem JSON gives."""
    out: dict = {}
    for key, value in _DESCRIBE.findall(text or ""):
        if key in SHAPE_KEYS or key == "slots":
            try:
                out["state_slots" if key == "slots" else key] = int(value)
            except ValueError:
                pass
        elif key == "dtype":
            out["input_dtype"] = value
        elif key == "gate":
            out["gate_dtype"] = value
        elif key == "scale":
            out["scale"] = number(value)
    words = set((text or "").split())
    if words:
        out["gate_mode"] = "fused" if "fused" in words else "direct"
        out["allow_negative_eigenvalues"] = "negeig" in words
        out["use_qk_l2norm"] = "l2norm" in words
        out["has_h0"] = "h0" in words
        out["has_hT"] = "hT" in words
        out["state_layout"] = "v_major" if "v_major" in words else "k_major"
    return out


def problem_of(verdict_json: dict) -> tuple[str, dict]:
    """(describe text, problem object) from a verdict: `problem` may be the text or the object;
    `problem_json` (or `gdn.problem`) may hold the object beside the text."""
    raw = verdict_json.get("problem")
    text = raw if isinstance(raw, str) else ""
    obj = None
    for key in ("problem_json", "gdn.problem"):
        candidate = verdict_json.get(key)
        if isinstance(candidate, str):
            try:
                candidate = json.loads(candidate)
            except json.JSONDecodeError:
                candidate = None
        if isinstance(candidate, dict):
            obj = candidate
            break
    if obj is None and isinstance(raw, dict):
        obj = raw
    if obj is None:
        obj = parse_problem_text(text)
    elif "N" not in obj and isinstance(obj.get("cu_seqlens"), list):
        obj = dict(obj, N=len(obj["cu_seqlens"]) - 1)
    return text, obj


def _generator_of(record: dict):
    generator = record.get("generator", record.get("gdn.generator"))
    if isinstance(generator, str):
        try:
            generator = json.loads(generator)
        except json.JSONDecodeError:
            return None
    return generator if isinstance(generator, dict) else None


def _verdict_from_json(record: dict, source: str) -> Verdict:
    for required in ("implementation", "status"):
        if required not in record:
            raise InputError(f"{source}: a verdict has no '{required}' (reports/README.md, verdict JSON)")
    status = str(record["status"]).upper()
    if status == "RAN":
        raise InputError(f"{source}: internal: adapter RAN records are not verdicts")
    if status not in STATUSES:
        raise InputError(f"{source}: verdict status must be one of {', '.join(STATUSES)}, got '{record['status']}'")
    text, problem = problem_of(record)
    # One kernel judged under two budget models (a campaign verifies with the calibrated budget
    # and again with the fixed thresholds) is two rows, never one mixed tally.
    implementation = str(record["implementation"])
    budget = str(record.get("budget", ""))
    model = re.match(r"[a-z]*", budget).group(0)
    if model in ("fixed", "bitwise"):
        implementation += f" [{model} budget]"
    v = Verdict(case=str(record.get("case", record.get("file", "?"))), implementation=implementation,
                status=status, problem_text=text, problem=problem, generator=_generator_of(record),
                worst_margin=number(record.get("worst_margin")), budget=str(record.get("budget", "")),
                message=str(record.get("message", "")), source=source, file=str(record.get("file", "")),
                output=str(record.get("output", "") or ""), device=str(record.get("device", "") or ""),
                judge=Path(source).name)
    for metric in record.get("metrics", []) or []:
        tensor = metric.get("tensor")
        v.rel_rms[tensor] = number(metric.get("rel_rms"))
        v.max_abs_error[tensor] = number(metric.get("max_abs_error"))
    for metric in record.get("baseline_metrics", []) or []:
        v.baseline_rel_rms[metric.get("tensor")] = number(metric.get("rel_rms"))
    for check in record.get("checks", []) or []:
        v.checks.append({"tensor": check.get("tensor"), "metric": check.get("metric"),
                         "error": number(check.get("error")), "budget": number(check.get("budget")),
                         "margin": number(check.get("margin")), "pass": bool(check.get("pass"))})
    if v.worst_margin is None and v.checks:
        margins = [c["margin"] for c in v.checks if c["margin"] is not None]
        v.worst_margin = max(margins) if margins else None
    return v


def _provenance_fields(obj: dict) -> dict:
    """device/date/commit/command of a results file; the commit may also come from
    `versions["gdn-testbed"]`, where gdn-testbed's own JSON records its build."""
    fields = {key: (str(obj[key]) if obj.get(key) is not None else None)
              for key in ("device", "date", "commit", "command")}
    versions = obj.get("versions")
    if fields["commit"] is None and isinstance(versions, dict) and versions.get("gdn-testbed"):
        fields["commit"] = str(versions["gdn-testbed"])
    return fields


# --- Google Benchmark ------------------------------------------------------------------------

_STANDARD_BENCH_KEYS = {"name", "family_index", "per_family_instance_index", "run_name", "run_type",
                        "repetitions", "repetition_index", "threads", "iterations", "real_time", "cpu_time",
                        "time_unit", "aggregate_name", "aggregate_unit", "error_occurred", "error_message",
                        "label"}
_UNIT_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
_NAME_ARG = re.compile(r"(?:^|/)([A-Za-z_][A-Za-z0-9_]*):(-?\d+)(?=/|$)")
# Counters and peer fields that describe the problem rather than measure it.
SHAPE_COUNTERS = SHAPE_KEYS + ("batch", "sequences", "length", "B", "Ts")


def shape_from(counters: dict, name: str = "") -> dict:
    """The problem a benchmark ran: every `key:value` argument of its name (Google Benchmark's
    ArgNames, e.g. "BM_decode/batch:256/column_lanes:0") and the shape counters N, T, H, HV,
    K, V, batch, sequences, length when the benchmark sets them."""
    shape = {key: int(value) for key, value in _NAME_ARG.findall(name)}
    for key in SHAPE_COUNTERS:
        if counters.get(key) is not None and key not in shape:
            shape[key] = int(round(counters[key]))
    return shape


def _load_gbench(obj: dict, source: str, results: Results) -> int:
    context = obj.get("context") or {}
    results.context[source] = context
    entries = obj.get("benchmarks")
    if not isinstance(entries, list):
        raise InputError(f"{source}: Google Benchmark JSON needs a 'benchmarks' list")
    # With repetitions, report the median aggregate; without, the single iteration run.
    has_median = {e.get("run_name") for e in entries if e.get("aggregate_name") == "median"}
    count = 0
    for entry in entries:
        if entry.get("error_occurred"):
            continue
        run_name = entry.get("run_name", entry.get("name"))
        aggregate = entry.get("aggregate_name", "")
        if entry.get("run_type") == "aggregate":
            if aggregate != "median":
                continue
        elif run_name in has_median:
            continue
        for required in ("name", "real_time", "time_unit"):
            if required not in entry:
                raise InputError(f"{source}: benchmark entry lacks '{required}'")
        unit = _UNIT_MS.get(entry["time_unit"])
        if unit is None:
            raise InputError(f"{source}: time_unit must be ns/us/ms/s, got '{entry['time_unit']}'")
        counters = {key: number(value) for key, value in entry.items()
                    if key not in _STANDARD_BENCH_KEYS and number(value) is not None}
        results.benchmarks.append(Benchmark(name=str(run_name), source=source,
                                            time_ms=float(entry["real_time"]) * unit,
                                            shape=shape_from(counters, str(run_name)), counters=counters,
                                            aggregate=aggregate, label=str(entry.get("label", "") or "")))
        count += 1
    return count


def gbench_provenance(context: dict) -> dict:
    """device/date/commit/command from the context: the custom context keys device, commit,
    command (--benchmark_context=device=...,commit=...,command=... or AddCustomContext; also
    accepted with a "gdn." prefix or in capitals, as cuda/bench/bench_common.cpp writes them), date as
    Google Benchmark writes it, the executable when no command was recorded."""
    def get(key):
        for candidate in (key, "gdn." + key, key.upper()):
            if context.get(candidate):
                return str(context[candidate])
        return None
    return {"device": get("device"), "date": get("date"), "commit": get("commit"),
            "command": get("command") or (str(context["executable"]) if context.get("executable") else None)}


# --- peers -----------------------------------------------------------------------------------

_PEER_TOP_KEYS = ("name", "shape", "median_ms", "ms", "kind")


def _load_peer(obj: dict, source: str, results: Results) -> int:
    """Peer JSON (reports/README.md): `peer` is {"name", "version"} or a plain string; each
    result names its problem in `shape` (an object) or in top-level shape fields, and its
    time in `median_ms` (or `ms`)."""
    peer = obj.get("peer")
    if isinstance(peer, str):
        peer = {"name": peer, "version": str(obj.get("fla_version", obj.get("version", "")))}
    if not isinstance(peer, dict) or "name" not in peer:
        raise InputError(f"{source}: peer JSON needs 'peer': {{'name', 'version'}} or a name string")
    entries = obj.get("results")
    if not isinstance(entries, list):
        raise InputError(f"{source}: peer JSON needs a 'results' list")
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise InputError(f"{source}: results[{index}] must be an object")
        time_ms = number(entry.get("median_ms", entry.get("ms")))
        if time_ms is None:
            raise InputError(f"{source}: results[{index}] lacks 'median_ms' (the peer's median time in ms)")
        raw_shape = entry.get("shape")
        if raw_shape is None:
            raw_shape = {key: entry[key] for key in SHAPE_COUNTERS + ("lengths",) if key in entry}
        if not isinstance(raw_shape, dict):
            raise InputError(f"{source}: results[{index}]: 'shape' must be an object")
        shape = {key: int(value) for key, value in raw_shape.items()
                 if isinstance(value, (int, float)) and not isinstance(value, bool)}
        if isinstance(raw_shape.get("lengths"), list):
            shape.setdefault("N", len(raw_shape["lengths"]))
            shape.setdefault("T", int(sum(raw_shape["lengths"])))
        counters = {key: number(value) for key, value in entry.items()
                    if key not in _PEER_TOP_KEYS and key not in shape and number(value) is not None}
        if entry.get("kind"):
            counters["kind"] = str(entry["kind"])
        results.peers.append(PeerResult(peer=str(peer["name"]), version=str(peer.get("version", "")),
                                        name=str(entry.get("name", peer["name"])), source=source,
                                        time_ms=float(time_ms), shape=shape, counters=counters))
    return len(entries)


# --- conformance tallies ---------------------------------------------------------------------

def _load_tally(obj: dict, source: str, results: Results) -> int:
    """The GPU conformance suite's tally (cuda_gpu_tests --json): per kernel, per property,
    cases run / failed / skipped and the worst margin."""
    count = 0
    for kernel, entry in obj["kernels"].items():
        if not isinstance(entry, dict):
            raise InputError(f"{source}: kernels['{kernel}'] must be an object")
        properties = entry.get("properties") or {"(all)": entry}
        for prop, c in properties.items():
            for required in ("run", "failed", "skipped"):
                if required not in c:
                    raise InputError(f"{source}: kernels['{kernel}'] property '{prop}' lacks '{required}'")
            results.tallies.append({"source": source, "kernel": kernel, "property": prop, "run": int(c["run"]),
                                    "failed": int(c["failed"]), "skipped": int(c["skipped"]),
                                    "worst_margin": number(c.get("worst_margin"))})
            count += 1
    return count


def _load_fuzz(obj: dict, source: str, results: Results) -> int:
    """`gdn-testbed fuzz --json` (gdn-fuzz-results/1) / `merge` (gdn-fuzz-merged/1) output: per implementation
    tallies, and the shrunk failures with their replay commands."""
    tallies = obj.get("tallies")
    if not isinstance(tallies, dict):
        raise InputError(f"{source}: gdn-fuzz-results needs a 'tallies' object")
    for name, t in tallies.items():
        for required in ("pass", "fail", "error", "skipped"):
            if required not in t:
                raise InputError(f"{source}: tallies['{name}'] lacks '{required}'")
        results.fuzz.append({"source": source, "implementation": name, "pass": int(t["pass"]), "fail": int(t["fail"]),
                             "error": int(t["error"]), "skipped": int(t["skipped"]),
                             "worst_margin": number(t.get("worst_margin")), "worst_case": str(t.get("worst_case", "")),
                             "cases": obj.get("cases"),
                             "seconds": number(obj.get("seconds", obj.get("wall_seconds"))),
                             "shard": obj.get("shard"), "interrupted": bool(obj.get("interrupted"))})
    for f in obj.get("failures", []) or []:
        results.fuzz_failures.append({"source": source, "implementation": str(f.get("implementation", "?")),
                                      "status": str(f.get("status", "?")),
                                      "shrunk_problem": str(f.get("shrunk_problem", "")),
                                      "summary": str(f.get("summary", "")), "replay": str(f.get("replay", ""))})
    return len(tallies)


def _load_campaign_summary(obj: dict, source: str, results: Results) -> int:
    """reports/campaign/summarize_campaign.py's gdn-campaign-summary/1: compact verdict rows
    (columns named in the file), the fuzz tallies and shrunk failures."""
    columns, names, judges = obj.get("columns"), obj.get("implementations"), obj.get("judges") or []
    if not isinstance(columns, list) or not isinstance(names, list) or not isinstance(obj.get("verdicts"), list):
        raise InputError(f"{source}: a campaign summary needs 'columns', 'implementations' and 'verdicts' lists")
    for required in ("implementation", "status"):
        if required not in columns:
            raise InputError(f"{source}: campaign summary columns lack '{required}'")
    for index, row in enumerate(obj["verdicts"]):
        if not isinstance(row, list) or len(row) != len(columns):
            raise InputError(f"{source}: verdicts[{index}] must be a list of {len(columns)} values")
        r = dict(zip(columns, row))
        status = str(r["status"]).upper()
        if status not in STATUSES:
            raise InputError(f"{source}: verdicts[{index}]: status must be one of {', '.join(STATUSES)}")
        implementation = names[r["implementation"]] if isinstance(r["implementation"], int) else str(r["implementation"])
        problem = {key: r[key] for key in ("K", "V", "T", "N", "longest") if r.get(key) is not None}
        if r.get("dtype") not in (None, "unknown"):
            problem["input_dtype"] = r["dtype"]
        results.verdicts.append(Verdict(
            case=str(r.get("case") or "(passed)"), implementation=implementation, status=status,
            problem_text=str(r.get("problem") or ""), problem=problem, worst_margin=number(r.get("worst_margin")),
            rel_rms={"o": number(r.get("rel_rms_o")), "hT": number(r.get("rel_rms_hT"))},
            message=str(r.get("message") or ""), source=source, device=str(obj.get("device") or ""),
            regime=str(r.get("regime") or ""), worst_check=str(r.get("worst_check") or ""),
            judge=str(judges[r["source"]] if isinstance(r.get("source"), int) else r.get("source") or Path(source).name)))
    if isinstance(obj.get("fuzz"), dict):
        _load_fuzz(dict(obj["fuzz"], format="gdn-fuzz-merged/1"), source, results)
    return len(obj["verdicts"])


def _load_sanitize(obj: dict, source: str, results: Results) -> int:
    """collect_sanitize.py's gdn-sanitize/1: per compute-sanitizer tool, whether it ran, its
    errors (hazards for racecheck), exit code and the test filter."""
    tools = obj.get("tools")
    if not isinstance(tools, dict):
        raise InputError(f"{source}: a sanitizer summary needs a 'tools' object")
    for tool, entry in tools.items():
        if not isinstance(entry, dict) or "run" not in entry:
            raise InputError(f"{source}: tools['{tool}'] needs 'run'")
        results.sanitize.append(dict(entry, source=source, tool=tool))
    return len(tools)


def _load_chunked_accuracy(obj: dict, source: str, results: Results) -> int:
    """The chunked accuracy judge (cuda_chunked_accuracy): per case, the relative RMS error of o
    and hT of each implementation against the exact recurrence on the same inputs, the peer's
    under "peer" with its name in "implementation"."""
    count = 0
    for index, case in enumerate(obj["cases"]):
        if not isinstance(case, dict):
            raise InputError(f"{source}: cases[{index}] must be an object")
        for key, entry in case.items():
            if not isinstance(entry, dict) or "o" not in entry:
                continue
            name = str(entry.get("implementation", key))
            name = name[4:] if name.startswith("gdn.") else name
            rel = lambda t: number((entry.get(t) or {}).get("rel_rms")) if isinstance(entry.get(t), dict) else None  # noqa: E731
            results.errors.append({"source": source, "case": str(case.get("name", index)),
                                   "problem": str(case.get("problem", "")), "implementation": name,
                                   "rel_rms_o": rel("o"), "rel_rms_hT": rel("hT")})
            count += 1
    return count


# --- classification --------------------------------------------------------------------------

def _json_lines(path: Path) -> list:
    records = []
    for number_, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise InputError(f"{path}:{number_}: not JSON: {error}")
    return records


def _is_verdict(record) -> bool:
    return isinstance(record, dict) and "status" in record and "implementation" in record


def _load_faults(data: dict, source: str, results: Results) -> int:
    """A fault campaign (scripts/fault_campaign.sh): per planted fault and detector, caught,
    missed or error, with a detail line."""
    detectors = data.get("detectors")
    faults = data.get("faults")
    if not isinstance(detectors, list) or not all(isinstance(d, str) for d in detectors):
        raise InputError(f"{source}: 'detectors' must be a list of names")
    if not isinstance(faults, list):
        raise InputError(f"{source}: 'faults' must be a list")
    for i, row in enumerate(faults):
        if not isinstance(row, dict) or not isinstance(row.get("fault"), str) or not isinstance(row.get("detectors"), dict):
            raise InputError(f"{source}: faults[{i}] needs 'fault' (text) and 'detectors' (an object)")
        for d in detectors:
            r = row["detectors"].get(d)
            if not isinstance(r, dict) or r.get("result") not in ("caught", "missed", "error"):
                raise InputError(f"{source}: faults[{i}] ({row['fault']}): detector '{d}' needs result caught, missed or error")
    results.faults.append(dict(data, source=source))
    return len(faults)


def load_results(root: Path) -> Results:
    results = Results()
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".json", ".jsonl"))
    adapter_records = []  # (record, source)
    for path in files:
        source = str(path.relative_to(root))
        try:
            data = _json_lines(path) if path.suffix == ".jsonl" else json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            results.ignored.append((source, f"not JSON: {error}"))
            continue
        fmt = str(data.get("format", "")) if isinstance(data, dict) else ""
        if fmt.startswith("gdn-campaign-summary/"):
            count = _load_campaign_summary(data, source, results)
            results.provenance.append(Provenance(source, "campaign summary", records=count, **_provenance_fields(data)))
        elif fmt.startswith("gdn-sanitize/"):
            count = _load_sanitize(data, source, results)
            results.provenance.append(Provenance(source, "sanitizers", records=count, **_provenance_fields(data)))
        elif fmt.startswith("gdn-adapter-verdicts/"):
            if not isinstance(data.get("table"), list) or not all(isinstance(r, dict) and "id" in r for r in data["table"]):
                raise InputError(f"{source}: 'table' must be a list of runs, each with an 'id'")
            results.adapter_runs.append(dict(data, source=source))
            device = data.get("device", {})
            results.provenance.append(Provenance(
                source, "adapter verdicts", records=len(data["table"]),
                device=device.get("nvidia_smi") if isinstance(device, dict) else str(device),
                date=data.get("created"), commit=data.get("commit"), command=data.get("command")))
        elif fmt.startswith("gdn-backward-verdicts/"):
            if not isinstance(data.get("subjects"), list) or not all(isinstance(r, dict) and "subject" in r
                                                                     for r in data["subjects"]):
                raise InputError(f"{source}: 'subjects' must be a list, each with a 'subject'")
            results.backward_runs.append(dict(data, source=source))
            results.provenance.append(Provenance(source, "backward verdicts", records=len(data["subjects"]),
                                                 **_provenance_fields(data)))
        elif fmt.startswith("gdn-conformance-summary/"):
            if not isinstance(data.get("summary"), dict) or not all(
                    isinstance(data["summary"].get(k), int) for k in ("pass", "fail", "error", "skipped")):
                raise InputError(f"{source}: 'summary' needs integer pass, fail, error and skipped")
            results.conformance_runs.append(dict(data, source=source))
            results.provenance.append(Provenance(source, "conformance run", records=1, **_provenance_fields(data)))
        elif fmt.startswith("gdn-faults/"):
            count = _load_faults(data, source, results)
            results.provenance.append(Provenance(source, "fault campaign", records=count, **_provenance_fields(data)))
        elif fmt.startswith("gdn-manifest/"):
            results.manifests[device_kind(source)] = dict(data, source=source)
            results.provenance.append(Provenance(source, "manifest", records=1, **_provenance_fields(data)))
        elif isinstance(data, dict) and isinstance(data.get("cases"), list) and "metric" in data:
            count = _load_chunked_accuracy(data, source, results)
            results.provenance.append(Provenance(source, "chunked accuracy", records=count, **_provenance_fields(data)))
        elif isinstance(data, dict) and "context" in data and "benchmarks" in data:
            count = _load_gbench(data, source, results)
            results.provenance.append(Provenance(source, "google-benchmark", records=count,
                                                 **gbench_provenance(data["context"] or {})))
        elif isinstance(data, dict) and "peer" in data and "results" in data:
            count = _load_peer(data, source, results)
            results.provenance.append(Provenance(source, "peer " + (data["peer"] if isinstance(data["peer"], str) else str(data["peer"].get("name", "?"))), records=count,
                                                 **_provenance_fields(data)))
        elif isinstance(data, dict) and str(data.get("format", "")).startswith(("gdn-fuzz-results/", "gdn-fuzz-merged/")):
            count = _load_fuzz(data, source, results)
            fields = _provenance_fields(data)
            results.provenance.append(Provenance(source, "fuzz results", records=count, **fields))
        elif isinstance(data, dict) and isinstance(data.get("kernels"), dict):
            count = _load_tally(data, source, results)
            results.provenance.append(Provenance(source, "conformance tally", records=count,
                                                 **_provenance_fields(data)))
        elif isinstance(data, dict) and isinstance(data.get("verdicts"), list) or \
                isinstance(data, list) and data and all(_is_verdict(r) for r in data):
            records = data["verdicts"] if isinstance(data, dict) else data
            adapter = [r for r in records if r.get("status") == "RAN" or "file" in r and "formulation" in r]
            fields = _provenance_fields(data) if isinstance(data, dict) else \
                {"device": None, "date": None, "commit": None, "command": None}
            if adapter and len(adapter) == len(records):
                adapter_records.extend((r, source) for r in records)
                devices = sorted({str(r.get("device")) for r in records if r.get("device")})
                fields["device"] = fields["device"] or (", ".join(devices) if devices else None)
                # Each adapter record carries its run's date, command and versions: state the first.
                first = records[0]
                fields["date"] = fields["date"] or (str(first["date"]) if first.get("date") else None)
                fields["command"] = fields["command"] or (str(first["command"]) if first.get("command") else None)
                versions = first.get("versions") if isinstance(first.get("versions"), dict) else {}
                fields["commit"] = fields["commit"] or (str(versions["gdn-testbed"]) if versions.get("gdn-testbed") else None)
                results.provenance.append(Provenance(source, "adapter log", records=len(records), **fields))
            else:
                if fields["device"] is None:
                    devices = sorted({str(r.get("device")) for r in records if r.get("device")})
                    fields["device"] = ", ".join(devices) if devices else None
                results.verdicts.extend(_verdict_from_json(r, source) for r in records)
                results.provenance.append(Provenance(source, "verdicts", records=len(records), **fields))
        else:
            results.ignored.append((source, "neither verdicts, an adapter log, Google Benchmark nor peer JSON"))

    # Adapter logs: SKIPPED/ERROR records are verdicts of their own (the case never reached
    # verify); RAN records lend their problem and generator to verify's verdicts of that case.
    index = {}
    for record, source in adapter_records:
        if record.get("status") in ("SKIPPED", "ERROR"):
            results.verdicts.append(_verdict_from_json(record, source))
        else:
            for key in (record.get("output"), record.get("case"), record.get("file")):
                if key:
                    index[(str(record.get("implementation")), str(key))] = record
                    index[(str(record.get("implementation")), Path(str(key)).name)] = record
    for v in results.verdicts:
        if v.generator is not None and "cu_seqlens" in v.problem:
            continue
        for key in (v.output, v.file, v.message, v.case, Path(v.case).name):
            record = index.get((v.implementation, key)) if key else None
            if record:
                if "cu_seqlens" not in v.problem and isinstance(record.get("problem_json"), dict):
                    v.problem = dict(record["problem_json"], N=len(record["problem_json"]["cu_seqlens"]) - 1)
                if v.generator is None:
                    v.generator = _generator_of(record)
                if not v.device and record.get("device"):
                    v.device = str(record["device"])
                break
    # A verdict file that does not say where it ran takes the device of the adapter runs that
    # wrote its outputs (gdn-testbed verify itself runs on the host CPU).
    for p in results.provenance:
        if p.kind == "verdicts" and p.device is None:
            devices = sorted({v.device for v in results.verdicts if v.source == p.path and v.device})
            p.device = ", ".join(devices) if devices else None
    return results
