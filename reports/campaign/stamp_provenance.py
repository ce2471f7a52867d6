#!/usr/bin/env python3
"""Adds device, commit, command and the current UTC date to a merged fuzz result (JSON), in
place and atomically: `gdn-testbed merge` knows the shards, not where or how they ran.

usage: stamp_provenance.py MERGED_JSON DEVICE COMMIT COMMAND
"""
import datetime
import json
import os
import sys


def main(argv):
    if len(argv) != 5:
        sys.exit(__doc__)
    path, device, commit, command = argv[1:]
    data = json.load(open(path))
    data.update(device=device, commit=commit, command=command,
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=1)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main(sys.argv)
