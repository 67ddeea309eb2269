"""jsonl.py - the JSON objects of files of rw-bench and peer output lines, in file order: lines
that are not JSON objects (progress, warnings, other tools' text) are skipped. Shared by the tools
of this directory that read such files (phase_table.py, plot_rollout.py); they import it from
their own directory."""
import json


def objects(paths):
    out = []
    for p in paths:
        with open(p) as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    o = json.loads(line)
                except ValueError:
                    continue
                if isinstance(o, dict):
                    out.append(o)
    return out
