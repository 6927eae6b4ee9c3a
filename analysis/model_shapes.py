"""The programs' model-shape flags (--d-model --d-ff --layers --heads --d-kv --vocab --ffn
--tie-embeddings) as run matrices (slurm/sweep) and analysis/project.py name them: one
vocabulary, so a shape that is not a preset runs, plans and projects the same way
everywhere. The programs check the values (one line, exit 2); this module only maps names
to flags and names a shape in file names.

    entry = {"model": "t5-11.3b", "layers": 4}     # a run matrix's [matrix] models entry
    flags(entry)  -> ["--model", "t5-11.3b", "--layers", "4"]
    tag(entry)    -> "t5-11.3b-layers4"            # result file names

Standard library only: slurm/sweep imports it from this folder (also in an installed tree).
"""
import cli

# (key in a matrix entry and in project.py's namespace, program flag, kind)
SHAPE_KEYS = (
    ("d_model", "--d-model", "int"),
    ("d_ff", "--d-ff", "int"),
    ("layers", "--layers", "int"),
    ("heads", "--heads", "int"),
    ("d_kv", "--d-kv", "int"),
    ("vocab", "--vocab", "int"),
    ("ffn", "--ffn", ("relu", "gated-gelu")),
    ("tie_embeddings", "--tie-embeddings", "bool"),
)
KEYS = tuple(k for k, _, _ in SHAPE_KEYS)
INT_MAX = 2**31 - 1


class ShapeError(cli.BadInput, ValueError):
    """A model entry the vocabulary does not allow: one line naming it and what is allowed
    (the tools' one-line error, cli.BadInput; a ValueError for slurm/sweep's checks)."""


def _text(kind, v):
    """The program's text of a value: yes/no for a bool, the value otherwise (text given on a
    command line passes as it is: the program judges it)."""
    if kind == "bool" and isinstance(v, bool):
        return "yes" if v else "no"
    return str(v)


def check_entry(entry, where="model entry"):
    """entry as {"model": name, key: value, ...}: a preset name alone, or a table with
    "model" and any of KEYS (integers in [1, 2**31 - 1], ffn relu or gated-gelu,
    tie_embeddings true or false); ShapeError otherwise."""
    if isinstance(entry, str):
        if not entry:
            raise ShapeError(f"{where}: an empty model name")
        return {"model": entry}
    if not isinstance(entry, dict):
        raise ShapeError(f"{where}: {entry!r} is neither a preset name nor a table "
                         f"{{model = \"NAME\", {' | '.join(KEYS)} = ...}}")
    if not isinstance(entry.get("model"), str) or not entry["model"]:
        raise ShapeError(f"{where}: {entry!r} has no model = \"PRESET\"")
    for key, v in entry.items():
        if key == "model":
            continue
        kind = next((k for name, _, k in SHAPE_KEYS if name == key), None)
        if kind is None:
            raise ShapeError(f"{where}: unknown key '{key}' (allowed: model, {', '.join(KEYS)})")
        ok = (isinstance(v, bool) if kind == "bool" else
              v in kind if isinstance(kind, tuple) else
              isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= INT_MAX)
        if not ok:
            want = ("true or false" if kind == "bool" else
                    "one of " + ", ".join(f'"{x}"' for x in kind) if isinstance(kind, tuple) else
                    f"an integer in [1, {INT_MAX}]")
            raise ShapeError(f"{where}: {key} must be {want}, got {v!r}")
    return dict(entry)


def flags(entry):
    """The program flags of an entry: --model NAME and one flag per shape key given."""
    e = {"model": entry} if isinstance(entry, str) else entry
    out = ["--model", e["model"]]
    for key, flag, kind in SHAPE_KEYS:
        if key in e:
            out += [flag, _text(kind, e[key])]
    return out


def tag(entry):
    """A file-name-safe name of the entry's model: the preset, then each override in
    SHAPE_KEYS order: t5-11.3b-layers4, t5-v1_1-xl-ffn-relu-tie-yes."""
    e = {"model": entry} if isinstance(entry, str) else entry
    parts = [e["model"]]
    for key, _, kind in SHAPE_KEYS:
        if key not in e:
            continue
        v = _text(kind, e[key])
        parts.append(f"{key.replace('_', '')}{v}" if kind == "int" else f"{key.split('_')[0]}-{v}")
    return "-".join(parts)
