"""Reading a benchmark's JSON for bench/'s scripts: a missing file or one cut off part-way (a
benchmark that crashed or timed out leaves Google Benchmark's JSON unterminated) ends the script
with one line naming the file, not a traceback."""

import json
import sys


def load(path):
    """The JSON document at `path`, or exit with a message saying why it cannot be read."""
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        sys.exit(f"{path}: cannot read it ({e.strerror})")
    except json.JSONDecodeError as e:
        sys.exit(f"{path}: not a complete JSON document ({e.msg}, line {e.lineno}); did the "
                 "benchmark stop before the end?")
