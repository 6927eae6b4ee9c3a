"""Reader for shardbench HDF5 results (docs/trace-format.md).

    from shardbench_h5 import load
    run = load("results/fsdp_perf-fsdp-full-t5-small-w4-20261122-193800.h5")
    run.meta["status"], run.steps, run.events, run.memory, run.peaks

Needs Debian's python3-h5py, python3-numpy, python3-pandas (use /usr/bin/python3).
"""
import h5py
import numpy as np
import pandas as pd

SCHEMA_VERSION = 2
CATEGORIES = ["parameters", "gradients", "optimizer_state", "activations", "comm_buffers", "workspace"]


def _value(v):
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.ndarray):
        return [_value(x) for x in v.tolist()]
    if isinstance(v, np.generic):
        return v.item()
    return v


def _attrs(obj):
    return {k: _value(v) for k, v in obj.attrs.items()}


def _table(ds):
    frame = pd.DataFrame(ds[()]) if ds.shape[0] else pd.DataFrame(np.zeros(0, dtype=ds.dtype))
    for col in frame.columns:
        if frame[col].dtype == object:
            frame[col] = frame[col].map(_value)
    return frame


class Run:
    """One result file: metadata, provenance, plan, and pandas tables."""

    def __init__(self, path):
        self.path = str(path)
        with h5py.File(self.path, "r") as f:
            self.meta = _attrs(f)
            version = self.meta.get("schema_version")
            if version != SCHEMA_VERSION:
                raise ValueError(f"{self.path}: schema_version {version!r}, this reader knows {SCHEMA_VERSION}")
            # A projected result (analysis/project.py) has metadata, the plan and at most /events.
            projected = bool(self.meta.get("projected"))
            table = lambda name: _table(f[name]) if name in f or not projected else pd.DataFrame()  # noqa: E731
            self.provenance = _attrs(f["provenance"])
            self.ranks = table("provenance/ranks")
            self.plan = _attrs(f["plan"])
            self.steps = table("steps")
            self.events = table("events")
            op_names = _value(f["events"].attrs["op_names"]) if "events" in f else []
            phase_names = _value(f["events"].attrs["phase_names"]) if "events" in f else []
            self.memory = table("memory")
            self.peaks = table("memory_peaks")
        if len(self.events):
            self.events["op_name"] = pd.Categorical.from_codes(self.events["op"], op_names)
            self.events["phase_name"] = pd.Categorical.from_codes(self.events["phase"], phase_names)
            self.events["duration"] = self.events["end"] - self.events["start"]

    @property
    def timed_steps(self):
        """Steps after the warm-up."""
        return self.steps[self.steps["warmup"] == 0] if len(self.steps) else self.steps

    def __repr__(self):
        m = self.meta
        return f"<Run {m.get('program')} {m.get('label')} {m.get('model')} w{m.get('world_size')} {m.get('status')}>"


def load(path):
    return Run(path)
